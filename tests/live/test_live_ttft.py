"""A prompt served from our storage tiers is never slower than computing it (issue 26).

What ``scripts/compare_long_context.sh`` does, at the smallest size that showed it: two long
prompts, each first computed alone, then both at once (after ``/flush_cache``) with their prefixes
from our host tier. sglang's ``torch_native`` attention used to attend from every token of a
sequence, cached prefix included, so a hit paid the whole prompt's attention again; a hit that
shared a batch with a longer one paid for that one's too, and came out slower than its cold run
(6,890-token prompts: 8.1 s from storage, 4.6 s recomputed). TTFT is timed by the streaming client,
the way the benchmark times it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from devtools.bench.client import RequestResult, SglangClient
from devtools.bench.workloads import BenchRequest

from .conftest import SharedServer
from .probe import LiveClient, prompt, reusable

# Prompt lengths (tokens): both above the 4,096-token prefill chunk, so the cold runs are chunked
# as compare_long_context.sh's long documents are, and far enough apart that one hit waits on the
# other's batch.
LENGTHS = (4_160, 9_280)
# With ~99% of each prompt from storage a hit's forward pass must beat its cold one by far more
# than a shared machine's noise: at most half of it. Measured on TTFT: 0.03-0.06x; 0.17x and 0.08x
# with the machine's load at 29 on its 2 cores; before the attention adaptation the 4,160-token hit
# took 0.91x (it waited on the other hit's whole-prompt attention). The forward pass, not TTFT: a
# fresh-clone run beside a disk benchmark waited 0.30 s for its prefetch to be scheduled, and a
# 0.51 s cold run then made TTFT 0.84x, the bug's figure, with a forward pass of 0.26x.
AT_MOST = 0.5
ATTEMPTS = 6


def _round(client: SglangClient, ids: list[list[int]], label: str) -> list[RequestResult]:
    requests = [BenchRequest(f"{label}-{i}", 0, p, 4, 0) for i, p in enumerate(ids)]
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(client.generate, requests))
    assert not any(r.error for r in results), results
    return results


def test_storage_hits_are_never_slower_than_their_cold_runs(shared_server: SharedServer) -> None:
    # The shared server: our host tier, an explicit host pool (SGLang's default sizing refuses to
    # start when a shared machine has less than its 10 GiB reserve free), step times in replies.
    server = shared_server.server
    client, probe = SglangClient(server.url), LiveClient(server.url)

    # Backups land after a request finishes and a flush can overtake one: a round counts only when
    # both prompts come whole from storage. Load only ever adds time, so the bound holds when one
    # complete round meets it: the attention bug failed every round alike, a load spike does not
    # (a fresh clone beside a benchmark saw one round's short hit wait out the other's prefetch:
    # forward 0.27 s and TTFT 0.33 s against a cold run's TTFT of 0.46 s). Each round has prompts
    # of its own and measures their cold runs just before their hits, so both see the same load
    # (at a sustained load of 5-9 on two cores, hits were 1.4x cold runs measured a minute earlier).
    report: list[str] = []
    for attempt in range(ATTEMPTS):
        ids = [prompt(n, seed=26 + 2 * attempt + i) for i, n in enumerate(LENGTHS)]
        # Each cold run alone: what computing the prompt costs, with no other request to wait for.
        cold = [_round(client, [p], f"cold{attempt}-{i}")[0] for i, p in enumerate(ids)]
        assert all(r.cached_tokens == 0 for r in cold), cold
        probe.flush()
        hits = _round(client, ids, "hit")
        if not all(r.storage_tokens == reusable(n) for r, n in zip(hits, LENGTHS, strict=True)):
            report.append(f"round {attempt}: not all from storage: {hits}")
            continue
        report += [f"round {attempt}, {n} tokens: cold {c.ttft_s:.2f} s (forward {_forward_s(c):.2f}), "
                   f"from storage {h.ttft_s:.2f} s (forward {_forward_s(h):.2f}; {h.steps})"
                   for n, c, h in zip(LENGTHS, cold, hits, strict=True)]
        # Never slower than computing it, end to end; and the forward pass, where the attention bug
        # lived, free of the queue and prefetch waits a loaded machine adds to TTFT.
        if all(h.ttft_s <= c.ttft_s and _forward_s(h) <= AT_MOST * _forward_s(c)
               for c, h in zip(cold, hits, strict=True)):
            break
    else:
        raise AssertionError("no round met the bounds:\n" + "\n".join(report))
    print("\n".join(report))  # shown with -rP: the figures a passing run measured


def _forward_s(result: RequestResult) -> float:
    """Seconds from the request's first forward step to its prefill's end, as the server saw them."""
    steps = result.steps
    assert {"forward_entry_time", "prefill_finished_time"} <= steps.keys(), (
        f"the server sent no step times (--enable-metrics): {steps}")
    return steps["prefill_finished_time"] - steps["forward_entry_time"]
