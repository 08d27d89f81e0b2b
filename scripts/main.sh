#!/usr/bin/env bash
# The main job on the embedded default config, after setting up what is missing.
#   no GPU: the CPU end-to-end through SGLang's real HiCacheController, host pool and backend
#           factory, a long-context workload of 8 MiB pages through our tiers; prints the
#           per-tier report (pages and bytes moved, load time vs recompute).
#   GPU:    the live-server long-context benchmark: no HiCache vs HiCache L2 vs our backend.
# Extra arguments go to the script that runs (e.g. --json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  exec .venv/bin/python scripts/bench_long_context.py --launch --tiers configs/default.yaml "$@"
fi
echo "[main] no GPU here: running the CPU end-to-end (scripts/run_e2e_cpu.py)" >&2
exec .venv/bin/python scripts/run_e2e_cpu.py "$@"
