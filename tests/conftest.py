"""The suite's tiers: every test gets one marker from where it lives, so a run can pick a tier.

| marker    | what its tests need                                              | in ``--fast`` |
|-----------|------------------------------------------------------------------|---------------|
| ``unit``    | nothing but this package and its Python dependencies           | yes           |
| ``sglang``  | real sglang 0.5.23 classes in this process (pools, controller) | yes           |
| ``service`` | processes of ours or Mooncake's on 127.0.0.1 (pool, master)    | yes           |
| ``live``    | live ``sglang.launch_server`` processes (20-60 s to start each)| no            |
| ``cluster`` | network namespaces (root) with live servers behind a router    | no            |
| ``bench``   | a benchmark script run end to end at its smallest setting      | no            |

Two more markers are set by the tests themselves: ``ha`` (Mooncake masters failing over through
etcd; in the whole suite, not in ``--fast``) and ``chaos`` (minutes of live traffic under faults;
opt-in, ``bash scripts/test.sh -m chaos``). A third, ``slow``, is set here on the tests of the first
three tiers that took 2 s or more each on a quiet two-core machine (``SLOW``: fresh interpreters
that import SGLang, masters killed and restarted, crash and stress tests): together they cost ten
minutes, so the whole suite runs them and ``--fast`` leaves them out. ``scripts/test.sh`` turns
these into ``-m`` expressions (``docs/testing.md`` lists each tier's budget and measured time).

The tier of a file is the first rule of ``TIERS`` whose path prefix it starts with; a file no rule
names is ``unit``. Rules name files only where a folder mixes tiers.

The suite runs SGLang on this CPU host as an operator who opted in to the CPU adaptations would
(the ``mooncake-sgl-cpu`` distribution of ``cpu_host/``, which ``scripts/bootstrap.sh`` installs, and
``MOONCAKE_SGL_CPU_ADAPTATIONS=1``, inherited by every process a test starts); the tests of that
switch start their own interpreters with it unset.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from mooncake_sgl import envs

ROOT = Path(__file__).resolve().parent

TIERS: tuple[tuple[str, str], ...] = (
    ("live/", "live"),
    ("cluster/", "cluster"),
    ("tiers/test_bench_write_path.py", "bench"),
    ("sim/test_replay_script.py", "bench"),
    ("hicache/test_router_indexer.py", "service"),
    ("hicache/", "sglang"),
    ("e2e/", "sglang"),
    ("pool/", "service"),
    ("doctor/test_pool_board_access.py", "service"),
    ("adversarial/test_pool_", "service"),
    ("tiers/test_mooncake_store_tier.py", "service"),
    ("tiers/test_pool_tier.py", "service"),
    ("metrics/test_pool_metrics.py", "service"),
)

# Node ids under tests/ (a file, or a file and a test function: every parametrization of it).
SLOW: tuple[str, ...] = (
    "adversarial/test_lmdb_full_disk.py::test_on_a_full_disk_the_store_evicts_old_ssd_pages_to_keep_the_newest",
    "adversarial/test_lmdb_truncation.py::test_flipped_bytes_anywhere_in_the_index_never_crash_or_give_wrong_bytes",
    "adversarial/test_pool_slow_clients.py::test_a_get_whose_reply_is_never_read_releases_its_pages",
    "adversarial/test_pool_slow_clients.py::test_idle_connections_are_closed_and_clients_reconnect_without_a_failure",
    "adversarial/test_pool_slow_clients.py::test_reservations_and_leases_held_past_hold_timeout_are_voided",
    "adversarial/test_ssd_shared_dir_stress.py",
    "doctor/test_hostile_endpoints.py::test_all_reads_of_one_server_share_the_timeout",
    "e2e/test_prefetch_timeline.py::test_the_tracer_wraps_sglangs_staging_and_every_backends_calls_only_when_asked",
    "hicache/test_backend.py::test_attach_loads_sglangs_page_hash_before_the_first_request",
    "hicache/test_builtin_config_sharing.py",
    "hicache/test_cpu_adaptations.py::test_sgl_kernel_standin_lets_the_scheduler_import_without_cuda",
    "hicache/test_hybrid_differential.py",
    "hicache/test_platform_selection.py",
    "hicache/test_restart.py",
    "hicache/test_router_events.py",
    "hicache/test_router_indexer.py",
    "hicache/test_split_heads.py::test_sglangs_own_backend_shares_heads_between_tp_sizes",
    "hicache/test_split_heads.py::test_tp_sizes_share_heads_both_ways_through_our_shared_tiers",
    "hicache/test_split_heads.py::test_without_a_shared_lcm_a_tp1_page_is_not_offered_to_tp2",
    "hicache/test_touch_points.py::test_sglang_changes_exactly_as_the_lists_declare",
    "hicache/test_weight_updates.py::test_an_update_without_a_version_keys_every_mla_rank_alike",
    "hicache/test_weight_updates.py::test_in_a_scheduler_process_the_plugin_hooks_sglangs_weight_updates_and_flush",
    "metrics/test_backend_metrics.py",
    "metrics/test_multiprocess.py",
    "metrics/test_stats_url_bounds.py::test_a_trickling_endpoint_is_cut_at_the_timeout",
    "policy/test_adaptive.py::test_adaptive_follows_the_expert_that_fits_the_workload",
    "policy/test_adaptive.py::test_adaptive_is_near_the_best_reference_and_never_below_lru",
    "policy/test_curve.py::test_a_sampled_heat_curve_is_corrected_by_lrus_miniature_beside_it",
    "policy/test_curve.py::test_a_sampled_heat_holds_its_leaves_back_as_long_as_the_tiers_chains_hold_them",
    "policy/test_curve.py::test_adaptive_is_modelled_within_2_points_on_generated_shapes",
    "policy/test_curve_process.py::test_the_child_exits_when_its_parent_dies",
    "pool/test_server_processes.py::test_server_killed_mid_batch_and_restarted_clients_recover_without_wrong_data",
    "test_gpu_check.py::test_cpu_self_test_prints_its_table_and_json_and_says_it_was_not_a_gpu_run",
    "test_gpu_check.py::test_the_hbm_step_fails_when_pytest_skipped_the_cuda_class",
    "test_gpu_check.py::test_what_the_check_imports_beyond_torch_and_pytest_is_on_the_gpu_host_or_carried",
    "test_gpu_check.py::test_without_cuda_it_refuses_in_one_line_with_exit_2",
    "test_suite_tiers.py::test_pytest_xdist_sends_each_group_to_one_worker",
    "tiers/test_lmdb_tier.py::test_after_damage_events_a_small_disk_still_takes_a_full_tier",
    "tiers/test_mooncake_store_tier.py",
    "tiers/test_ssd_write_route.py::test_a_fresh_tiers_first_large_batch_times_both_ways_then_writes_the_rest_the_faster",
    "tiers/test_ssd_write_route.py::test_a_tier_whose_buffered_writes_are_throttled_moves_to_o_direct_and_reads_back_exact",
)

MARKERS = {
    "unit": "needs nothing but this package and its Python dependencies",
    "sglang": "real sglang classes in the test process",
    "service": "starts processes of ours or Mooncake's on 127.0.0.1",
    "live": "starts live sglang.launch_server processes",
    "cluster": "network namespaces with live servers behind a router (root)",
    "bench": "runs a benchmark script end to end at its smallest setting",
    "ha": "Mooncake masters failing over through etcd (about a minute)",
    "xdist_group": "tests one pytest-xdist worker runs as a unit (set here: the live servers, or a file)",
    "slow": "a unit, sglang or service test of 2 s or more (SLOW in tests/conftest.py); not in --fast",
    "chaos": "minutes of live traffic under faults (opt-in: -m chaos)",
}

envs.MOONCAKE_SGL_CPU_ADAPTATIONS.set_default(1)


def tier_of(path: Path) -> str:
    """The tier marker of a test file, from its path under ``tests/``."""
    rel = path.resolve().relative_to(ROOT).as_posix()
    return next((tier for prefix, tier in TIERS if rel.startswith(prefix)), "unit")


def is_slow(path: Path, name: str) -> bool:
    """Is the test function ``name`` (parameters left out) of the file at ``path`` one of ``SLOW``?"""
    rel = path.resolve().relative_to(ROOT).as_posix()
    return rel in SLOW or f"{rel}::{name.split('[')[0]}" in SLOW


def pytest_configure(config: pytest.Config) -> None:
    # A suite started with `&` from a non-interactive shell (nohup, CI wrappers) inherits SIGINT
    # ignored, and so would every process it starts: Python then installs no KeyboardInterrupt, and
    # the tests that stop a child with Ctrl-C (stats --watch, a cluster's teardown) wait on it for
    # ever. A handler, unlike an ignored signal, is reset to the default by exec.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        config.stash[_CRASH_LOG] = open(crash_log(worker["testrunuid"], worker["workerid"]), "w")  # noqa: SIM115
    elif getattr(config.option, "numprocesses", None):
        # The controller of a run on workers: xdist once waited for ever on its workers after one
        # had crashed (every worker idle, the run at 97%). A stalled run fails with its stack.
        faulthandler.dump_traceback_later(SESSION_TIMEOUT_S, exit=True)


# A worker's fault handler and its "running" lines go to a file of its own: a worker that died
# (a native crash, or the hard timeout below) left nothing in the run's output, so which test it
# was running was never known. The controller prints the file when xdist reports the worker down.
_CRASH_LOG = pytest.StashKey["object"]()
SESSION_TIMEOUT_S = 3600.0


def pytest_unconfigure(config: pytest.Config) -> None:
    log = _fault_file(config)
    if log is not None:  # a worker that ends cleanly leaves no log behind
        faulthandler.disable()  # it wrote to this file
        log.close()
        Path(log.name).unlink(missing_ok=True)


def crash_log(testrunuid: str, workerid: str) -> Path:
    return Path(tempfile.gettempdir()) / f"mcsgl-pytest-{testrunuid}-{workerid}.log"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist (controller): a worker ended; when it crashed, say what it was running and how."""
    path = crash_log(node.workerinput["testrunuid"], node.gateway.id)  # type: ignore[attr-defined]
    if not error:
        return
    try:
        text = path.read_text(errors="replace")
        path.unlink()
    except OSError:
        return
    if text:
        lines = text.splitlines()
        last = next((ln for ln in reversed(lines) if ln.startswith("running ")), "no test started")
        tail = "\n".join(lines[-80:])
        node.config.get_terminal_writer().line(  # type: ignore[attr-defined]
            f"\n[{node.gateway.id}] crashed ({error}, {_end_of(node)}); it was {last}; "
            f"its fault log:\n{tail}", red=True)


def _end_of(node: object) -> str:
    """How a worker process ended: a signal (SIGKILL leaves no fault trace) or an exit status (a
    native ``exit()``, say), read from the process execnet started it as."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return "its end is unknown"
    try:
        code = popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return "its process still runs"
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


# What one pytest-xdist worker runs as a unit when the suite runs on two (``scripts/test.sh``): every
# test that starts live servers or a cluster, in one worker one at a time (two live modules at once
# would share two cores between their servers, and two clusters would tear each other's leftovers
# down), and every other file whole, so its module fixtures (Mooncake masters, pools) start once.
SERVERS_GROUP = "servers"


def xdist_group(path: Path, tier: str) -> str:
    if tier in ("live", "cluster"):
        return SERVERS_GROUP
    return path.resolve().relative_to(ROOT).as_posix()


# First: pytest-xdist's worker reads the xdist_group markers in this same hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(os.fspath(item.path))
        tier = tier_of(path)
        item.add_marker(tier)
        item.add_marker(pytest.mark.xdist_group(xdist_group(path, tier)))
        if is_slow(path, getattr(item, "originalname", item.name)):
            item.add_marker("slow")


# A test still running after this long (the slowest, a cluster under faults, takes about 6 minutes on
# a loaded machine) prints every thread's stack and ends its process, so a stalled run says where it
# stalled and fails instead of hanging CI. faulthandler's watchdog is a C thread that needs no GIL: a
# worker once blocked for good on malloc's lock, inside a signal handler, holding the GIL, where no
# Python-level timer could have run.
HARD_TIMEOUT_S = 900.0


def _fault_file(config: pytest.Config):  # noqa: ANN202 (an open text file, or None)
    return config.stash.get(_CRASH_LOG, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 (hook)
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    fd = _fault_file(item.config) or item.config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.dump_traceback_later(HARD_TIMEOUT_S, exit=True, file=fd)
    try:
        yield
    finally:
        if fd is not None:
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # The suite's one process loads native libraries (Mooncake's transfer engine, torch) that may
    # install a SIGSEGV handler of their own, which writes into the fd 2 that pytest captures: a
    # whole run once died of a segmentation fault with no trace. Re-arm Python's handler on
    # pytest's own copy of the terminal's stderr before each test, for every thread's stack.
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    log = _fault_file(item.config)
    if log is not None:
        log.write(f"running {item.nodeid}\n")
        log.flush()
    fd = log or item.config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.enable(file=fd, all_threads=True)
