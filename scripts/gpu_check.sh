#!/usr/bin/env bash
# GPU host check, prepared on a CPU-only machine and not yet run on a GPU.
#
#   1. the HBM tier's tests on the CUDA device (the conformance suite runs on cuda as well as cpu);
#   2. a short live-server long-context benchmark with a tiny random-weight Llama:
#      no HiCache vs our backend (HBM + host + LMDB tiers), SGLang caches flushed between rounds;
#      it fails unless our variant served prompt tokens from storage in the reuse rounds.
#
# Needs: one CUDA GPU, this package installed in the Python environment (pip install -e '.[sglang,bench]')
# so SGLang's plugin loader finds the backend, and about 10 minutes. Outputs go to $OUT_DIR.
# Knobs: PYTHON, OUT_DIR, GPU_CHECK_MULTITURN=1 (also run the multi-turn benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${OUT_DIR:-gpu_check_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

"$PY" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device is visible; this check is for GPU hosts "
             "(on a CPU-only machine run: bash scripts/main.sh)")
from importlib.metadata import entry_points
names = [e.value for e in entry_points(group="sglang.srt.plugins")]
if "mooncake_sgl.hicache.plugin:register" not in names:
    sys.exit("gpu_check.sh: mooncake_sgl is not installed (pip install -e .); SGLang would use its own "
             "'mooncake' backend")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
EOF

echo "== 1/2 HBM tier tests on the device"
"$PY" -m pytest -q -p no:cacheprovider tests/tiers/test_hbm_tier.py 2>&1 | tee "$OUT/hbm_tier_tests.txt"

cat > "$OUT/tiers_hbm_host_lmdb.yaml" <<EOF
tiers:
  - {kind: hbm, capacity: 2GiB, device: cuda}
  - {kind: host, capacity: 4GiB}
  - {kind: lmdb, path: "$OUT/lmdb", capacity: 32GiB, sync: false}
policy: {name: lru}
EOF

# A small device KV pool and host pool, page size 64, no CUDA graphs (faster start).
SERVER_ARGS=(--server-arg=--page-size=64 --server-arg=--mem-fraction-static=0.3
             --server-arg=--hicache-size=8 --server-arg=--disable-cuda-graph)

echo "== 2/2 long-context benchmark: no-hicache vs ours (tiny random-weight Llama)"
rm -rf "$OUT/lmdb"
"$PY" scripts/bench_long_context.py --launch \
    --variant no-hicache --variant "ours=ours:$OUT/tiers_hbm_host_lmdb.yaml" \
    --docs 3 --min-doc-tokens 8192 --max-doc-tokens 32768 --questions 3 --max-parallel 3 \
    "${SERVER_ARGS[@]}" --health-timeout 600 --log-dir "$OUT" \
    --json "$OUT/long_context.json" --plot "$OUT/long_context.png" 2>&1 | tee "$OUT/long_context.txt"

"$PY" - "$OUT/long_context.json" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
ours = next(v for v in data["variants"] if v["label"] == "ours")
reuse = ours["reuse_rounds"]
assert reuse and reuse["errors"] == 0, "our variant had request errors"
assert reuse["storage_tokens"] > 0, "our variant served no tokens from storage after the cache flushes"
print(f"gpu_check: ours served {reuse['storage_tokens']:,} of {reuse['prompt_tokens']:,} prompt tokens "
      f"from storage in the reuse rounds; mean TTFT {reuse['ttft_mean_s'] * 1e3:.0f} ms")
EOF

if [[ "${GPU_CHECK_MULTITURN:-0}" == "1" ]]; then
  echo "== extra: multi-turn benchmark"
  rm -rf "$OUT/lmdb"
  "$PY" scripts/bench_multiturn.py --launch \
      --variant no-hicache --variant "ours=ours:$OUT/tiers_hbm_host_lmdb.yaml" \
      --conversations 8 --turns 4 --first-turn-tokens 4096 --max-parallel 8 \
      "${SERVER_ARGS[@]}" --health-timeout 600 --log-dir "$OUT" \
      --json "$OUT/multiturn.json" --plot "$OUT/multiturn.png" 2>&1 | tee "$OUT/multiturn.txt"
fi
echo "gpu_check: done; outputs in $OUT"
