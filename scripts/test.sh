#!/usr/bin/env bash
# The test suite: set up what is missing, lint, then the tests (what CI runs: .ci/run).
#
#   bash scripts/test.sh            everything but the opt-in chaos tests: SGLang integration, live
#                                   servers, the real mooncake_master, clusters (as root), benchmarks
#                                   at their smallest setting; budget 20 minutes after set-up
#   bash scripts/test.sh --fast     no live server, namespace, benchmark, HA fail-over or test marked
#                                   slow (2 s or more each); budget 3 minutes
#   bash scripts/test.sh -m chaos   the opt-in chaos tests (any -m replaces the default selection)
#
# Other arguments go to pytest (a path, -k EXPR, -x ...). The tiers are markers set by folder in
# tests/conftest.py; docs/testing.md lists each tier's budget and measured time.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/bootstrap.sh
set_up=$((SECONDS - started))
.venv/bin/ruff check mooncake_sgl cpu_host devtools scripts tests

select=(-m "not chaos")
# Two pytest-xdist workers: one runs every live-server and cluster test, one at a time; the other
# the in-process files, each file whole (tests/conftest.py, xdist_group). A -n given here wins.
# A worker that dies is not replaced: under loadgroup a replacement re-ran the dead worker's group
# (a crashing test again on every new worker) or left the run waiting with every worker idle; the
# death is reported at once, with the test it was running (tests/conftest.py).
workers=(-n 2 --dist loadgroup --max-worker-restart 0)
args=()
for arg in "$@"; do
  case "$arg" in
    --fast) select=(-m "not (live or cluster or bench or ha or chaos or slow)") ;;
    -m|-m*) select=(); args+=("$arg") ;;
    *) args+=("$arg") ;;
  esac
done
status=0
.venv/bin/python -m pytest -q --durations=25 "${workers[@]}" "${select[@]}" "${args[@]}" || status=$?
echo "[test] wall time: $((SECONDS - started)) s in all, $set_up s of it set-up (exit $status)"
exit $status
