#!/usr/bin/env bash
# The main job: live SGLang servers serving a long-context workload side by side, on the embedded
# default tiers (no config file, no servers to start by hand), after setting up what is missing.
#
#   no HiCache  |  HiCache host only (L2)  |  HiCache + mooncake_sgl on its embedded default tiers
#
# Prints TTFT mean/p50/p99, throughput, where cached tokens came from (device, host, our tiers, and
# per tier of ours), the measured prefill rate and load vs recompute; writes out/main.json and
# out/main.png. Without a GPU the servers run on the CPU with a small random-weight Llama; with one,
# pass --model-path. Extra arguments go to the benchmark
# (python -m devtools.bench long-context --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
mkdir -p out
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  sizes=(--docs 4 --min-doc-tokens 8192 --max-doc-tokens 65536 --questions 4)
else
  echo "[compare_long_context] no GPU here: live CPU servers with a 4-layer random-weight Llama" >&2
  sizes=(--docs 4 --min-doc-tokens 2048 --max-doc-tokens 12288 --questions 3 --model-layers 4
         --model-hidden 1024 --max-parallel 2)
fi
exec .venv/bin/python -m devtools.bench long-context --launch --log-dir out/logs \
  --json out/main.json --plot out/main.png "${sizes[@]}" "$@"
