"""The diagnoses: evidence in, findings out. Pure functions of ``ServerEvidence``, no I/O.

Each rule looks for one reason a storage hit did not happen (or will not), and says it as a person
would: what happened, the evidence (a metric, a configuration value), and the fix. Rules speak only
when their evidence is there; a rule whose evidence is missing says nothing rather than guess.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..hicache.namespace_board import NamespaceRecord
from ..metrics.model import size_label
from .evidence import (
    SGLANG_PREFETCH_THRESHOLD,
    SGLANG_TIMEOUT_BASE_S,
    SGLANG_TIMEOUT_PER_KI_TOKEN_S,
    ExtraConfig,
    ServerEvidence,
    namespace_record,
)

WARNING, INFO = "warning", "info"
# Under this share of the uncached prompt tokens looked up in storage, most are never asked for.
# SGLang stops a lookup at its first missing chunk, so a healthy share can be below 1; not this low.
NOT_ASKED_SHARE = 0.5
# Uncached pages a server must have computed before the share means anything.
MIN_UNCACHED_PAGES = 16
# A writer busy this share of the window is saturated: the backup queue grows until SGLang drops.
SATURATED = 0.9
# A tier that evicted and holds at least this share of what it can hold is at its size: the store
# evicts down to a low watermark below capacity (a tier at 75% after evicting is full).
FULL = 0.5
# Hit-ratio points a doubled tier must gain to call the tier too small, and a halved one may lose
# to call it larger than its traffic needs.
GAIN_TOO_SMALL = 0.05
LOSS_TOO_LARGE = 0.01
# Pages a curve must have seen before it speaks about sizes.
MIN_CURVE_LOOKUPS = 1000


@dataclass(frozen=True)
class Finding:
    """One diagnosis of one server (or of several: ``server`` lists them)."""

    server: str
    code: str
    level: str
    says: str
    evidence: tuple[str, ...]
    fix: str


Rule = Callable[[ServerEvidence], list[Finding]]


def unreadable(ev: ServerEvidence) -> list[Finding]:
    if not ev.error:
        return []
    return [Finding(ev.name, "unreadable", WARNING, "could not be read: nothing else about it is known",
                    (ev.error,), "check the URL, that the server is up, and that its port is reachable")]


def arguments_unread(ev: ServerEvidence) -> list[Finding]:
    """Without its arguments, the rules take SGLang's defaults for them (a page size of 1, say):
    said, so that numbers built on them are read as such."""
    if not ev.args_error or ev.error:
        return []
    return [Finding(ev.name, "arguments_unread", WARNING,
                    "its arguments could not be read, so the diagnoses below assumed SGLang's defaults "
                    "for them (page size, write and prefetch policies, extra config)",
                    (ev.args_error,), "check that the URL is the SGLang server's and that a proxy in "
                    "front of it lets /get_server_info through")]


def odd_answers(ev: ServerEvidence) -> list[Finding]:
    """What the server served that no SGLang server does, each part left out of the other rules."""
    odd = ev.oddities()
    if not odd:
        return []
    return [Finding(ev.name, "odd_answers", WARNING,
                    "some of what it served is not what SGLang serves (below); the diagnoses that "
                    "need it were skipped, so their silence says nothing",
                    tuple(odd), "check that the URL is the SGLang server's (another service or a "
                    "proxy on that port answers otherwise) and that it runs this mooncake_sgl")]


def metrics_off(ev: ServerEvidence) -> list[Finding]:
    if ev.last is None or ev.error:
        return []
    ours = bool(ev.last.ours.tiers) or bool(ev.last.ours.store)
    theirs = any(name.startswith("sglang:") for name in ev.last.series)
    if ours and theirs:
        return []
    missing = " and ".join(w for w, have in (("SGLang's", theirs), ("mooncake_sgl's", ours)) if not have)
    backend = ev.arg("hicache_storage_backend", "")
    return [Finding(ev.name, "metrics_off", WARNING,
                    f"{missing} series are not in its /metrics, so most diagnoses below cannot run",
                    (f"enable_metrics={ev.arg('enable_metrics', 'unknown')}",
                     f"hicache_storage_backend={backend or 'none'}"),
                    "start the server with --enable-metrics (and --hicache-storage-backend mooncake)")]


def below_threshold(ev: ServerEvidence) -> list[Finding]:
    """Tokens SGLang computed without asking storage: a request's uncached part under
    ``prefetch_threshold``, or a prefetch held back while its host pool is over half full."""
    look = ev.last
    if look is None or not look.ours.store:
        return []
    mode = look.by_label("sglang:prefill_effective_tokens_total", "mode")
    uncached = mode.get("input", 0.0) - mode.get("device_hit", 0.0) - mode.get("host_hit", 0.0)
    threshold, where = ev.extra_config().setting("prefetch_threshold", SGLANG_PREFETCH_THRESHOLD, int)
    where = where or "prefetch_threshold in the extra config"
    page = ev.page_size()
    if page is None or uncached < MIN_UNCACHED_PAGES * page:
        return []  # no page size to count by (odd_answers says), or too little traffic to say
    asked = look.ours.store_total("lookup_pages") * page
    if asked >= NOT_ASKED_SHARE * uncached:
        return []
    why = (f"a request's uncached part under prefetch_threshold ({threshold} tokens)" if threshold > page
           else "prefetches held back while SGLang's host pool was over half full")
    fix = (f"lower prefetch_threshold (e.g. `prefetch_threshold: {page}`, one page, in the tiers YAML "
           "given as @FILE, or in the extra-config JSON)" if threshold > page
           else "give the host pool more room (--hicache-ratio or --hicache-size)")
    return [Finding(ev.name, "below_threshold", WARNING,
                    f"SGLang looked up only {asked:g} of the {uncached:g} prompt tokens it did not have "
                    f"cached ({asked / uncached:.0%}); storage is not asked for {why}, which SGLang logs "
                    "only at debug level, so a prefix another instance or an eviction left in storage "
                    "is recomputed",
                    (f"prefetch_threshold={threshold} ({where}), page_size={page}",
                     f'sglang:prefill_effective_tokens_total{{mode="input"}}={mode.get("input", 0.0):g}, '
                     f'device_hit={mode.get("device_hit", 0.0):g}, host_hit={mode.get("host_hit", 0.0):g}',
                     f"mooncake_sgl_lookup_pages_total={asked / page:g} pages"),
                    fix)]


def prefetch_unfulfilled(ev: ServerEvidence) -> list[Finding]:
    """Storage hits SGLang found and then did not load: ended by the timeout, by host memory, or
    by a failed read."""
    look = ev.last
    if look is None:
        return []
    by = look.by_label("sglang:storage_prefetch_unfulfilled_tokens_total", "reason")
    hit = look.total("sglang:storage_prefetch_hit_tokens_total")
    out = []
    extra = ev.extra_config()
    policy = ev.arg("hicache_storage_prefetch_policy", "best_effort")
    if by.get("deadline", 0) > 0:
        base = _timeout_setting(extra, "prefetch_timeout_base", SGLANG_TIMEOUT_BASE_S)
        per = _timeout_setting(extra, "prefetch_timeout_per_ki_token", SGLANG_TIMEOUT_PER_KI_TOKEN_S)
        out.append(Finding(
            ev.name, "prefetch_timeout", WARNING,
            f"{by['deadline']:g} tokens found in storage were not loaded: their prefetch ran past its "
            f"deadline under the `{policy}` prefetch policy, and they were recomputed",
            (f'sglang:storage_prefetch_unfulfilled_tokens_total{{reason="deadline"}}={by["deadline"]:g}'
             f" of {hit:g} hit tokens",
             f"hicache_storage_prefetch_policy={policy}, prefetch_timeout_base={base}, "
             f"prefetch_timeout_per_ki_token={per}"),
            "raise prefetch_timeout_base / prefetch_timeout_per_ki_token in the extra config, or use "
            "--hicache-storage-prefetch-policy wait_complete; check the slow tier's get latency "
            "(mooncake_sgl_tier_get_latency_seconds)"))
    if by.get("host_capacity", 0) > 0:
        out.append(Finding(
            ev.name, "prefetch_host_memory", WARNING,
            f"{by['host_capacity']:g} tokens found in storage were not loaded: SGLang's host pool had "
            "no room to stage them",
            (f'sglang:storage_prefetch_unfulfilled_tokens_total{{reason="host_capacity"}}='
             f"{by['host_capacity']:g}",
             f"hicache_ratio={ev.arg('hicache_ratio', 'unknown')}, "
             f"hicache_size={ev.arg('hicache_size', 'unknown')}"),
            "give the host pool more room (--hicache-ratio or --hicache-size)"))
    if by.get("storage_transfer", 0) > 0:
        out.append(Finding(
            ev.name, "prefetch_read_failed", WARNING,
            f"{by['storage_transfer']:g} tokens found in storage could not be read back",
            (f'sglang:storage_prefetch_unfulfilled_tokens_total{{reason="storage_transfer"}}='
             f"{by['storage_transfer']:g}",),
            "see the tier findings below and the server log's mooncake_sgl lines"))
    return out


def _timeout_setting(extra: ExtraConfig, key: str, default: float) -> str:
    """A prefetch timeout setting as evidence shows it: its value, and where from when not the
    extra config's own."""
    value, where = extra.setting(key, default, (int, float))
    return f"{value} ({where})" if where else f"{value}"


def backups(ev: ServerEvidence) -> list[Finding]:
    """Pages SGLang did not offer to storage: its write policy, or its backup queue overflowing."""
    look = ev.last
    out = []
    policy = ev.arg("hicache_write_policy", "")
    computed = look.total("sglang:prefill_effective_tokens_total", mode="input") if look else 0.0
    if policy in ("write_through_selective", "write_back"):
        when = ("on its second hit" if policy == "write_through_selective"
                else "only when evicted from the device")
        out.append(Finding(
            ev.name, "write_policy", INFO if policy == "write_back" else WARNING,
            f"SGLang backs a page up to storage {when}, so a prefix used once is never stored: "
            "another instance, or this one after a restart, cannot load it",
            (f"hicache_write_policy={policy}",
             f'sglang:prefill_effective_tokens_total{{mode="input"}}={computed:g}'),
            "use --hicache-write-policy write_through to share every prefix (more writes)"))
    dropped = look.total("sglang:hicache_backup_dropped_tokens_total") if look else 0.0
    if dropped > 0:
        out.append(Finding(
            ev.name, "backups_dropped", WARNING,
            f"SGLang dropped {dropped:g} tokens' backups before they reached storage",
            (f"sglang:hicache_backup_dropped_tokens_total={dropped:g}",),
            "storage takes pages slower than they are offered: see the writer finding, or give the "
            "slow tier a faster disk"))
    return out


def tiers(ev: ServerEvidence) -> list[Finding]:
    """Our tiers' refusals, corrupt pages, a full tier and a saturated writer."""
    if ev.last is None:
        return []
    now = ev.last.ours.by_tier()
    then = ev.first.ours.by_tier() if ev.first is not None else {}
    span = ev.last.at - ev.first.at if ev.first is not None else 0.0
    out = []
    for name, t in now.items():
        if t.puts_refused > 0:
            out.append(Finding(
                ev.name, "tier_refused", WARNING,
                f"tier {name} refused {t.puts_refused:g} pages (no room after eviction, or down)",
                (f'mooncake_sgl_tier_puts_refused_total{{tier="{name}"}}={t.puts_refused:g}',),
                f"see the server log's mooncake_sgl lines for tier {name}; give it more capacity if full"))
        if t.corrupt_pages > 0:
            out.append(Finding(
                ev.name, "tier_corrupt", WARNING,
                f"tier {name} returned {t.corrupt_pages:g} pages that failed their checksum (each a miss)",
                (f'mooncake_sgl_tier_corrupt_pages_total{{tier="{name}"}}={t.corrupt_pages:g}',),
                "check the medium (disk errors in the kernel log, a pool's memory)"))
        room = t.holdable_bytes or t.capacity_bytes
        if room > 0 and t.resident_bytes >= FULL * room and t.evictions > 0:
            out.append(Finding(
                ev.name, "tier_full", INFO,
                f"tier {name} is at its size: it has evicted {t.evictions:g} pages and holds "
                f"{t.resident_bytes / 2**20:.1f} of {room / 2**20:.1f} MiB",
                (f'mooncake_sgl_tier_resident_bytes{{tier="{name}"}}={t.resident_bytes:g}',
                 f'mooncake_sgl_tier_holdable_bytes{{tier="{name}"}}={room:g}',
                 f'mooncake_sgl_tier_evictions_total{{tier="{name}"}}={t.evictions:g}'),
                "its capacity curve (policy.capacity_curves) says whether more room would pay"))
        before = then.get(name)
        if before is not None and span > 0:
            busy = (t.write_busy_seconds - before.write_busy_seconds) / span
            if busy >= SATURATED:
                out.append(Finding(
                    ev.name, "writer_saturated", WARNING,
                    f"tier {name}'s writer was busy {busy:.0%} of the last {span:.1f} s: pages are "
                    "offered faster than it stores them",
                    (f'rate(mooncake_sgl_tier_write_busy_seconds_total{{tier="{name}"}})={busy:.2f}',),
                    "give the tier a faster disk, or admit fewer pages to it (policy admission)"))
    return out


def curves(ev: ServerEvidence) -> list[Finding]:
    """A tier whose capacity curve says it is too small, or larger than its traffic needs."""
    if ev.last is None or not ev.last.ours.curves:
        return []
    out = []
    dropped = ev.last.ours.store_total("curve_dropped_pages")
    if dropped > 0:
        looked = ev.last.ours.store_total("lookup_pages")
        out.append(Finding(
            ev.name, "curves_partial", WARNING,
            f"the capacity curves left out {dropped:g} of {looked:g} looked-up pages while their "
            "process was behind: their hit ratios cover part of the traffic",
            (f"mooncake_sgl_curve_dropped_pages_total={dropped:g}",
             f"mooncake_sgl_curve_process_seconds_total={ev.last.ours.store_total('curve_process_seconds'):g}"),
            "leave the host a spare core for the curve process (it runs at niceness 10), or run "
            "policy lru, whose curves cost least"))
    page = ev.page_size()
    if page is None:
        return out
    for name in sorted({t for _, t, _ in ev.last.ours.curves}):
        points = {m: (cap, look, hit) for m, cap, look, hit in ev.last.ours.curve_of(name)}
        own = points.get(1.0)
        if own is None or own[1] < MIN_CURVE_LOOKUPS:
            continue
        ratio = {m: hit / look if look else 0.0 for m, (_, look, hit) in points.items()}
        bigger = [m for m in points if m > 1 and ratio[m] - ratio[1.0] >= GAIN_TOO_SMALL]
        if bigger:
            m = min(bigger)
            cap, look, hit = points[m]
            tokens = (hit - own[2]) * page
            out.append(Finding(
                ev.name, "tier_too_small", INFO,
                f"tier {name} at {size_label(m)} its size ({cap / 2**30:.2f} GiB) would have hit "
                f"{ratio[m]:.0%} of lookups, not {ratio[1.0]:.0%}: about {tokens:g} more prefill tokens "
                "served from storage",
                (f'mooncake_sgl_tier_curve_hit_pages_total{{tier="{name}",size="{size_label(m)}"}}={hit:g}',
                 f'... size="1x": {own[2]:g} of {own[1]:g} lookups'),
                f"raise tier {name}'s capacity toward {cap / 2**30:.2f} GiB"))
            continue
        smaller = [m for m in points if m < 1 and ratio[1.0] - ratio[m] <= LOSS_TOO_LARGE]
        if smaller:
            m = min(smaller)
            cap = points[m][0]
            out.append(Finding(
                ev.name, "tier_too_large", INFO,
                f"tier {name} at {size_label(m)} its size ({cap / 2**30:.2f} GiB) would have hit "
                f"{ratio[m]:.0%} of lookups against {ratio[1.0]:.0%} now: its traffic needs less room",
                (f'mooncake_sgl_tier_curve_hit_pages_total{{tier="{name}",size="{size_label(m)}"}}',),
                f"tier {name} could give up room (to {cap / 2**30:.2f} GiB) without losing hits"))
    return out


# Share of the pages reaching our local tiers that could not be announced, past which routers see
# too little of them to be worth the feature. Arbitrary.
UNANNOUNCED_TOO_MANY = 0.5


def router_events(ev: ServerEvidence) -> list[Finding]:
    """Router events on (``router_events: local``) with nothing to publish them on, or with most
    pages left unannounced."""
    if ev.last is None:
        return []
    total = ev.last.ours.store_total
    announced, unannounced = total("router_announced_pages"), total("router_unannounced_pages")
    if not unannounced:
        return []
    evidence = (f"mooncake_sgl_router_announced_pages_total={announced:g}",
                f"mooncake_sgl_router_unannounced_pages_total={unannounced:g}")
    if not ev.arg("kv_events_config"):
        return [Finding(ev.name, "router_events_unpublished", WARNING,
                        f"router_events is local but SGLang publishes no KV events: {unannounced:g} pages "
                        "in this instance's tiers are invisible to routers",
                        (*evidence, "kv_events_config=None"),
                        "start SGLang with --kv-events-config '{\"publisher\": \"zmq\", \"endpoint\": "
                        "\"tcp://*:5557\"}' (docs/routing.md), or set router_events: off")]
    if unannounced / (announced + unannounced) > UNANNOUNCED_TOO_MANY:
        return [Finding(ev.name, "router_events_mostly_unannounced", INFO,
                        f"{unannounced:g} of {announced + unannounced:g} pages reaching this instance's "
                        "tiers could not be announced to routers when stored: SGLang never published "
                        "their hash (requests with a LoRA adapter or a cache_salt), or published it too "
                        "long ago to be remembered",
                        evidence,
                        "nothing to fix for namespaced requests (their event hashes cannot be derived "
                        "from storage keys); see docs/routing.md")]
    return []


# Share of judged hits the load gate cut short past which a slow tier is costing most of what the
# storage could save. Arbitrary.
GATE_DECLINES_MANY = 0.25


def load_gate(ev: ServerEvidence) -> list[Finding]:
    """Hits the load gate cut short: a tier reads slower than this server recomputes."""
    if ev.last is None:
        return []
    total = ev.last.ours.store_total
    lookups = total("gate_lookups")
    declined = total("gate_declined_lookups") + total("gate_abandoned_lookups")
    if not declined or declined / max(lookups, 1.0) <= GATE_DECLINES_MANY:
        return []
    pages = total("gate_declined_pages") + total("gate_abandoned_pages")
    return [Finding(ev.name, "hits_slower_than_recompute", WARNING,
                    f"{declined:g} of {lookups:g} storage hits were cut short ({pages:g} page objects "
                    "recomputed): loading them from a tier was expected to take longer than this "
                    "server recomputing them, at the lookup or once their first page was read",
                    (f"mooncake_sgl_gate_declined_lookups_total={total('gate_declined_lookups'):g}",
                     f"mooncake_sgl_gate_abandoned_lookups_total={total('gate_abandoned_lookups'):g}",
                     f"mooncake_sgl_gate_lookups_total={lookups:g}",
                     f"mooncake_sgl_gate_declined_pages_total={total('gate_declined_pages'):g}",
                     f"mooncake_sgl_gate_abandoned_pages_total={total('gate_abandoned_pages'):g}"),
                    "check the slow tier's get latency (mooncake_sgl_tier_get_latency_seconds) and what "
                    "else uses its disk or link; a faster tier, or more room in a fast one, turns these "
                    "back into hits (docs/tiers.md#the-load-gate)")]


PER_SERVER: tuple[Rule, ...] = (unreadable, arguments_unread, odd_answers, metrics_off, below_threshold,
                                prefetch_unfulfilled, backups, tiers, curves, router_events, load_gate)


def namespaces(servers: Sequence[ServerEvidence], board: Sequence[tuple[str, NamespaceRecord]] = ()
               ) -> list[Finding]:
    """Instances keyed into one shared tier whose pages cannot meet, naming the differing fields.
    ``board``: (where, record) read from shared tiers' namespace boards, for instances not given."""
    known = [(ev.name, ns, rec) for ev in servers for ns in ev.namespaces()
             if (rec := namespace_record(ns)) is not None]
    out = []
    for i, (a, na, ra) in enumerate(known):
        for b, nb, rb in known[i + 1:]:
            shared = set(filter(None, na["shared"].split(","))) & set(filter(None, nb["shared"].split(",")))
            if a == b or not shared:
                continue
            diffs = ra.differences(rb)
            if diffs:
                out.append(Finding(
                    f"{a} + {b}", "namespace_mismatch", WARNING,
                    f"{a} and {b} key into the same shared tier ({', '.join(sorted(shared))}) but can "
                    "never read each other's pages: " + "; ".join(diffs).replace(" here,", f" on {a},")
                    .replace(" there", f" on {b}"),
                    tuple(f"mooncake_sgl_namespace_info on {s}: " + ", ".join(f"{k}={v}" for k, v in n.items()
                                                                          if k != "shared")
                          for s, n in ((a, na), (b, nb))),
                    "make the differing settings equal on both (docs/pd.md lists what keys a page)"))
    for where, rec in board:
        if known and not any(rec.identity()[1:] == own.identity()[1:] for _, _, own in known):
            name, _, own = known[0]
            diffs = own.differences(rec)
            host = rec.host or "an unnamed host"
            out.append(Finding(
                name, "namespace_other", INFO,
                f"another configuration keys into {where} ({rec.role} on {host}); "
                f"its pages and {name}'s cannot meet: " + "; ".join(diffs),
                (f"namespace board on {where}: model={rec.model}, page_size={rec.page_size}, "
                 f"layout={rec.layout}, key_tp={rec.key_tp}, dtype={rec.dtype}",),
                "if the two should share pages, make the differing settings equal"))
    return out


def diagnose(servers: Sequence[ServerEvidence],
             board: Sequence[tuple[str, NamespaceRecord]] = ()) -> list[Finding]:
    """Every finding for ``servers`` (and the board records read beside them), warnings first."""
    found = [f for ev in servers for rule in PER_SERVER for f in rule(ev)]
    found += namespaces(servers, board)
    return sorted(found, key=lambda f: (f.level != WARNING, f.server, f.code))
