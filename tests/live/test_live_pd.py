"""Mooncake's own architecture on live servers: prefill and decode on separate SGLang instances
(``--disaggregation-mode``, ``mooncake_tcp`` transfer, SGLang's mini load balancer in front), our
pool between them, so the next turn of a conversation starts from cache on whichever prefill it
lands (``devtools.testing.pd``).

One deployment serves the module: prefill A and prefill B over one pool tier (every shared page
crosses the pool), a decode that offloads its output pages, a balancer per prefill; the cold
reference is the live tests' shared server (not PD, its own tiers). Every output is compared
with the reference's for the same prompt: greedy ids and bit-identical logprobs. The pool is
killed by the last test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.bench.server import LaunchedServer
from devtools.testing.pd import PdServers
from devtools.testing.pool_process import PoolProcess
from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV

from .conftest import HEALTH_TIMEOUT_S, TEST_HOST_RESERVE, SharedServer, wait_for, write_tiers
from .probe import LiveClient, Output, prompt, reusable
from .test_live_shared import pool_pages

PAGE = 64
PROMPT_PAGES = 16
OUTPUT_TOKENS = 128
FLAGS = ("--max-total-tokens", "16384")


@dataclass
class Deployment:
    pool: PoolProcess
    tiers: Path
    servers: PdServers
    a: LaunchedServer
    b: LaunchedServer
    decode: LaunchedServer
    via_a: LiveClient
    via_b: LiveClient
    reference: LiveClient

    def cold(self, ids: list[int], new_tokens: int = 8) -> Output:
        return self.reference.generate(ids, new_tokens)


@pytest.fixture(scope="module")
def pd(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory,
       shared_server: SharedServer) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("pd")
    made = PdServers(tiny_model, root / "logs", FLAGS, env={HOST_RESERVE_ENV: TEST_HOST_RESERVE},
                     health_timeout_s=HEALTH_TIMEOUT_S)
    with PoolProcess(capacity="256MiB") as pool:
        tiers = write_tiers(root / "tiers.yaml",
                            f'tiers:\n  - {{kind: pool, endpoints: ["{pool.endpoint}"]}}\n')
        try:
            with ThreadPoolExecutor(3) as ex:  # start-ups overlap
                started = [ex.submit(made.server, "prefill-a", "prefill", tiers),
                           ex.submit(made.server, "prefill-b", "prefill", tiers),
                           ex.submit(made.server, "decode", "decode-offload", tiers)]
                a, b, decode = (f.result() for f in started)
                balancers = [ex.submit(made.balancer, "lb-a", [a], [decode]),
                             ex.submit(made.balancer, "lb-b", [b], [decode])]
                lb_a, lb_b = (f.result() for f in balancers)
            yield Deployment(pool, tiers, made, a, b, decode, LiveClient(lb_a.url), LiveClient(lb_b.url),
                             LiveClient(shared_server.server.url))
        finally:
            made.close()


def test_turn_two_on_another_prefill_reads_the_prompt_and_the_decodes_output_pages(pd: Deployment) -> None:
    turn1 = prompt(PROMPT_PAGES * PAGE, seed=41)
    first = pd.via_a.generate(turn1, OUTPUT_TOKENS)
    assert len(first.output_ids) == OUTPUT_TOKENS and first.same_as(pd.cold(turn1, OUTPUT_TOKENS))
    # Prefill A backs up the whole pages of the prompt; the decode, the whole pages of its output
    # (never the last sampled token, which it has not run through the model).
    pages = PROMPT_PAGES + (OUTPUT_TOKENS - 1) // PAGE
    wait_for(lambda: pool_pages(pd.pool.endpoint) >= pages, 60,
             f"prefill A's {PROMPT_PAGES} prompt pages and the decode's output pages in the pool")

    turn2 = turn1 + list(first.output_ids) + prompt(300, seed=42)
    second = pd.via_b.generate(turn2)
    assert second.storage_tokens == pages * PAGE, second
    assert second.same_as(pd.cold(turn2)), second


def test_the_prefills_and_the_decode_find_each_other_on_the_pool(pd: Deployment) -> None:
    """Each instance posts its namespace on the pool's board; one that finds the other role there
    says, in one line, whether their pages meet (``namespace_board``)."""
    logs = (pd.a, pd.b, pd.decode)

    def said(text: str) -> bool:
        return any(text in s.log_path.read_text(errors="replace") for s in logs)

    wait_for(lambda: said("shares pages with the"), 60, "a prefill or the decode naming its peer")
    assert not said("cannot share pages"), [s.log_path for s in logs]


def test_a_decode_with_a_radix_cache_restores_the_prefix_from_our_tiers(pd: Deployment) -> None:
    ids = prompt(PROMPT_PAGES * PAGE + 40, seed=43)
    before = pool_pages(pd.pool.endpoint)
    assert pd.via_b.generate(ids).same_as(pd.cold(ids))  # prefill B stores the prompt's pages
    wait_for(lambda: pool_pages(pd.pool.endpoint) >= before + PROMPT_PAGES, 60,
             "prefill B's backup in the pool")

    decode = pd.servers.server("decode-radix", "decode-radix", pd.tiers)
    via = LiveClient(pd.servers.balancer("lb-radix", [pd.a], [decode]).url)
    log = pd.a.log_path.read_text(errors="replace")
    restored = via.generate(ids)
    assert restored.same_as(pd.cold(ids)), restored
    assert restored.storage_tokens == reusable(len(ids)), restored  # from our tiers, by the decode
    # Prefill A, which never saw the prompt, computed only what the decode did not restore.
    new = pd.a.log_path.read_text(errors="replace")[len(log):]
    computed = [int(n) for n in re.findall(r"#new-token: (\d+)", new)]
    assert computed and sum(computed) == len(ids) - reusable(len(ids)), new[-2000:]


def test_the_pool_killed_between_turns_is_a_miss_and_fails_no_request(pd: Deployment) -> None:
    turn1 = prompt(PROMPT_PAGES * PAGE, seed=44)
    before = pool_pages(pd.pool.endpoint)
    first = pd.via_a.generate(turn1, OUTPUT_TOKENS)
    wait_for(lambda: pool_pages(pd.pool.endpoint) >= before + PROMPT_PAGES, 60, "turn 1 in the pool")
    pd.pool.kill()

    turn2 = turn1 + list(first.output_ids) + prompt(300, seed=45)
    second = pd.via_b.generate(turn2)
    assert second.storage_tokens == 0, second
    assert second.same_as(pd.cold(turn2)), second
