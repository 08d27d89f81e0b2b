"""Every change this package makes to SGLang, declared once: the list the plug-in applies.

A touch point is one SGLang symbol or setting, what is done to it, at which moment (``Phase``),
under which condition, on which SGLang versions, and why. Nothing changes SGLang but ``apply``
going through a list of them: the plug-in's entry point applies ``POINTS`` of ``Phase.PLUGINS``,
``backend.py`` those of ``Phase.BACKEND`` when SGLang's factory first loads it, and the CPU-host
distribution (``cpu_host/``, ``mooncake_sgl_cpu.touch_points``) keeps its own list of the same
records. Each record names the function that makes its change (``apply``, given the record: the
patched symbol is read from ``target``) and the predicate of its condition, both as
``module:function`` paths, so the lists import nothing heavy and render as data:
``docs/sglang-touch-points.md`` quotes ``table(POINTS)``, and the boundary test
(``tests/hicache/test_touch_points.py``) requires what fresh SGLang processes see changed to be
exactly what the lists declare.
"""

from __future__ import annotations

import enum
import logging
import pkgutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# The SGLang versions whose code the gated touch points were read against.
CHECKED_SGLANG = frozenset({"0.5.23"})

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
BACKEND_FACTORY = "sglang.srt.mem_cache.storage.backend_factory.StorageBackendFactory"
BUILTIN_STORE = "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store.MooncakeStore"


class Phase(enum.Enum):
    """When SGLang runs the code that applies a touch point."""

    PLATFORM = "platform discovery"  # sglang.srt.platforms entry points, before the scheduler's imports
    PLUGINS = "load_plugins()"  # sglang.srt.plugins entry points, at the start of every SGLang process
    BACKEND = "backend import"  # SGLang's factory loading mooncake_sgl.hicache.backend


class Kind(enum.Enum):
    """What is done to the target; the boundary test reads it to know what it must see change."""

    REGISTRY_ENTRY = "registry entry set"
    ENV_DEFAULT = "environment default"
    HOOK_AROUND = "AROUND hook (SGLang's HookRegistry)"
    HOOK_AFTER = "AFTER hook (SGLang's HookRegistry)"
    VIRTUAL_SUBCLASS = "virtual subclass registered"
    WRAP = "method wrapped"
    REPLACE = "method replaced"
    BIND = "module name bound"
    SET = "attribute set"
    SYS_MODULE = "sys.modules entry"


@dataclass(frozen=True)
class Condition:
    """Where a touch point applies: in words, and the ``module:function`` that decides it."""

    text: str
    holds: str


@dataclass(frozen=True)
class TouchPoint:
    """One change to SGLang.

    ``target`` is the dotted path of the symbol (``module.Class.attr`` or ``module.name``), an
    environment variable's name (``ENV_DEFAULT``) or a module name (``SYS_MODULE``). ``sglang`` is
    the versions it is applied on (``None``: any). ``apply`` is called with the record and returns
    whether it changed SGLang now (``False``: already so, or nothing to do here).
    """

    target: str
    kind: Kind
    change: str
    phases: tuple[Phase, ...]
    condition: Condition
    sglang: frozenset[str] | None
    why: str
    apply: str


def always() -> bool:
    return True


def in_a_scheduler() -> bool:
    """True in a scheduler process: ``run_scheduler_process`` loads the plug-ins from within
    ``sglang.srt.managers.scheduler``, so that module is there already. Anywhere else the hooked
    methods are never called, and resolving them would import the scheduler's whole chain."""
    return SCHEDULER_MODULE in sys.modules


def sglang_version() -> str:
    try:
        from sglang.version import __version__
    except ImportError:
        return "unknown"
    return str(__version__)


def owner_of(target: str) -> tuple[object, str]:
    """The object that holds ``target``'s last name (a module or a class), and that name."""
    path, name = target.rsplit(".", 1)
    return pkgutil.resolve_name(path), name


def apply(points: Iterable[TouchPoint], phase: Phase) -> list[TouchPoint]:
    """Apply the points of ``phase`` whose condition holds, on the versions each was checked on;
    the points that changed SGLang now. A point that fails is logged and the others still apply
    (this runs inside SGLang's start-up, which must not die of an adaptation)."""
    version = sglang_version()
    applied, unchecked = [], []
    for point in points:
        if phase not in point.phases or not _resolve(point.condition.holds)():
            continue
        if point.sglang is not None and version not in point.sglang:
            unchecked.append(point.target)
            continue
        try:
            if _resolve(point.apply)(point):
                applied.append(point)
        except Exception:
            logger.exception("mooncake_sgl: %s (%s) could not be applied", point.target, point.kind.value)
    if unchecked:
        logger.warning("mooncake_sgl: sglang %s is not %s, which these changes were checked against; "
                       "left out: %s", version, ", ".join(sorted(CHECKED_SGLANG)), ", ".join(unchecked))
    return applied


_hooked: set[str] = set()


def register_hook(point: TouchPoint, fn: Callable[..., object]) -> bool:
    """Register ``fn`` with SGLang's hook registry as ``point``'s hook (AFTER or AROUND, as its kind
    says), which ``load_plugins`` applies next; True if registered now. Once per target: a second
    registration would run the hook twice."""
    if point.target in _hooked:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    kinds = {Kind.HOOK_AFTER: HookType.AFTER, Kind.HOOK_AROUND: HookType.AROUND}
    if point.kind not in kinds:
        raise ValueError(f"{point.target}: a {point.kind.value} is not a hook")
    HookRegistry.register(point.target, fn, kinds[point.kind])
    _hooked.add(point.target)
    return True


def _resolve(path: str) -> Callable[..., bool]:
    return pkgutil.resolve_name(path)


def table(points: Iterable[TouchPoint]) -> str:
    """The points as the Markdown table the docs quote."""
    rows = ["| SGLang symbol or setting | what is done | when | condition | sglang | why |",
            "|---|---|---|---|---|---|"]
    for p in points:
        versions = ", ".join(sorted(p.sglang)) if p.sglang is not None else "any"
        when = ", ".join(phase.value for phase in p.phases)
        rows.append(f"| `{p.target}` | {p.kind.value}: {p.change} | {when} | {p.condition.text} | "
                    f"{versions} | {p.why} |")
    return "\n".join(rows) + "\n"


EVERY_PROCESS = Condition("every SGLang process", "mooncake_sgl.hicache.touch_points:always")
SCHEDULER_PROCESS = Condition(
    "a scheduler process (run_scheduler_process imports sglang.srt.managers.scheduler before "
    "load_plugins())", "mooncake_sgl.hicache.touch_points:in_a_scheduler")
BUILTIN_STORE_IMPORTS = Condition(
    "SGLang's MooncakeStore module imports (on a host without CUDA: only with the CPU distribution's "
    "sgl_kernel stand-in)", "mooncake_sgl.hicache.l3_layout:builtin_store_imports")

_WEIGHT_HOOKS_WHY = (
    "SGLang's weight updates never tell the storage backend, so pages of the old weights would be "
    "served for the new ones (weight_updates.py). Process-wide, in every scheduler whether or not our "
    "backend is attached: SGLang binds these methods into its request dispatcher and flush wrapper in "
    "Scheduler.__init__, before a backend attached at run time, and load_plugins() applies hooks only "
    "once, so a hook installed at attach would not be called. Cost where our backend is not attached: "
    "one Python call per update or flush, and per weight update one broadcast of a 32-character token "
    "from TP rank 0 over SGLang's world group (every rank runs it alike)")

POINTS: tuple[TouchPoint, ...] = (
    TouchPoint(
        target=f"{BACKEND_FACTORY}._registry['mooncake']",
        kind=Kind.REGISTRY_ENTRY,
        change="mooncake_sgl.hicache.backend.MooncakeSglStorage, loaded when a backend is built "
               "(SGLang logs that it overwrites its own)",
        phases=(Phase.PLUGINS,), condition=EVERY_PROCESS, sglang=None,
        why="the product: `--hicache-storage-backend mooncake` builds our backend (SGLang's plug-in API)",
        apply="mooncake_sgl.hicache.plugin:register_backend"),
    TouchPoint(
        target="SGLANG_HICACHE_MOONCAKE_REUSE_TE",
        kind=Kind.ENV_DEFAULT,
        change="0 unless the operator set it (inherited by the processes SGLang starts)",
        phases=(Phase.PLUGINS,), condition=EVERY_PROCESS, sglang=None,
        why="under the name `mooncake` SGLang creates a shared Mooncake TransferEngine at start-up for "
            "its own MooncakeStore (maybe_init_shared_mooncake_transfer_engine): nothing of ours uses "
            "it, and it fails the start without the mooncake package or on a host without RDMA",
        apply="mooncake_sgl.hicache.plugin:no_shared_transfer_engine"),
    *(TouchPoint(
        target=f"{WEIGHT_UPDATER}.update_weights_from_{kind}",
        kind=Kind.HOOK_AROUND,
        change="our backends stop serving while the weights change, then take the new weights' key "
               "namespace",
        phases=(Phase.PLUGINS,), condition=SCHEDULER_PROCESS, sglang=None,
        why=_WEIGHT_HOOKS_WHY,
        apply="mooncake_sgl.hicache.weight_updates:install_hook")
      for kind in ("disk", "tensor", "distributed", "ipc")),
    TouchPoint(
        target=f"{SCHEDULER_MODULE}.Scheduler.flush_cache",
        kind=Kind.HOOK_AFTER,
        change="after a successful flush, our backends take a namespace a weight update left pending",
        phases=(Phase.PLUGINS,), condition=SCHEDULER_PROCESS, sglang=None,
        why=_WEIGHT_HOOKS_WHY,
        apply="mooncake_sgl.hicache.weight_updates:install_hook"),
    TouchPoint(
        target="sglang.srt.disaggregation.kv_events.EventPublisherFactory.create",
        kind=Kind.HOOK_AFTER,
        change="the publisher SGLang builds for --kv-events-config is wrapped: its batches pass "
               "through, with our DISK events appended when a backend has router_events: local",
        phases=(Phase.PLUGINS,), condition=SCHEDULER_PROCESS, sglang=None,
        why="routers see pages in this instance's own tiers on SGLang's own stream (same endpoint, "
            "sequence numbers and replay buffer; router_events.py, docs/routing.md). Process-wide: "
            "SGLang builds its publisher in Scheduler.__init__, after the backend attached, and "
            "load_plugins() applies hooks only once. Cost with router_events off: one Python call "
            "per published batch; without --kv-events-config SGLang builds a null publisher, left alone",
        apply="mooncake_sgl.hicache.router_events:install_hook"),
    TouchPoint(
        target=f"{SCHEDULER_MODULE}.Scheduler.__init__",
        kind=Kind.HOOK_AFTER,
        change="once the scheduler is built, a weak reference to it is kept, from which our backends "
               "read its prefill totals (total_prefill_busy_us, total_prefill_uncached_tokens); "
               "nothing of the scheduler changes",
        phases=(Phase.PLUGINS,), condition=SCHEDULER_PROCESS, sglang=CHECKED_SGLANG,
        why="the load gate reports a storage hit only where loading it beats recomputing it, and "
            "recomputing is this server's prefill rate, which SGLang measures and keeps only on the "
            "scheduler (prefill_clock.py, policy/load_gate.py). The backend is built inside "
            "Scheduler.__init__ and is never handed the scheduler. Cost: one Python call per "
            "scheduler start",
        apply="mooncake_sgl.hicache.prefill_clock:install_hook"),
    TouchPoint(
        target=BUILTIN_STORE,
        kind=Kind.VIRTUAL_SUBCLASS,
        change="MooncakeSglStorage (abc.ABCMeta.register: isinstance holds, nothing is inherited)",
        phases=(Phase.BACKEND,), condition=BUILTIN_STORE_IMPORTS, sglang=CHECKED_SGLANG,
        why="Scheduler._hicache_l3_layout (GET /get_hicache_l3_cache_layout) asks only MooncakeStore "
            "instances for describe_l3_object_layout and answers 'not attached' for any other "
            "backend; nothing else in sglang 0.5.23 tests for the class",
        apply="mooncake_sgl.hicache.l3_layout:serve_layout_queries"),
)
