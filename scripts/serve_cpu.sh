#!/usr/bin/env bash
# A live SGLang server with mooncake_sgl as its HiCache storage backend, on 127.0.0.1:PORT, in the
# foreground. On a host without a GPU it adds the CPU flags (devtools/bench/server.py: CPU_FLAGS).
#
#   scripts/serve_cpu.sh PORT MODEL_DIR TIERS_FILE [more sglang flags...]
#
# Later flags override the defaults (sglang keeps the last value of a repeated flag). Prompts are token
# ids (--skip-tokenizer-init): MODEL_DIR needs config.json and weights but no tokenizer;
# `python -m devtools.tiny_model DIR` writes one.
#
# Stopping: SIGTERM or SIGINT to its process group (kill -TERM -- -PGID, or Ctrl-C). The server gets
# MOONCAKE_SGL_STOP_GRACE seconds (default 5) to exit, then every process it started is SIGKILLed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
# Without a GPU, SGLang serves HiCache only with the CPU-host adaptations (docs/cpu-hosts.md), a
# distribution of their own that scripts/bootstrap.sh installs; without them it fails deep in SGLang.
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } &&
   ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("mooncake_sgl_cpu") is None)'; then
  echo "serve_cpu.sh: no GPU and no mooncake-sgl-cpu here: run scripts/bootstrap.sh" \
       "(or: $py -m pip install --no-deps -e $root/cpu_host)" >&2
  exit 2
fi
exec "$py" -m devtools.bench.server "$@"
