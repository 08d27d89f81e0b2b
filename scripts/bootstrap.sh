#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine (CPU or GPU):
# .venv with torch, sglang 0.5.23 (lean install: no CUDA kernels it won't use here), the package and
# the CPU-host adaptations' distribution (cpu_host/) in editable mode, Debian's libibverbs1 for the
# mooncake wheel, and the real Mooncake Store wheel.
# Re-running is cheap: a stamp of this file and both pyproject.toml skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MOONCAKE_SGL_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.bootstrap-$(cat scripts/bootstrap.sh pyproject.toml cpu_host/pyproject.toml | sha256sum | cut -c1-16)"
[ -f "$stamp" ] && exit 0

say() { printf '[bootstrap] %s\n' "$*" >&2; }

# Debian packages: libibverbs1 for the mooncake wheel; g++, ninja and OpenSSL headers for the C++
# page-hash extension sglang compiles on first use.
apt_missing=()
ldconfig -p 2>/dev/null | grep -q libibverbs.so.1 || apt_missing+=(libibverbs1)
command -v g++ >/dev/null || apt_missing+=(g++)
command -v ninja >/dev/null || apt_missing+=(ninja-build)
[ -f /usr/include/openssl/sha.h ] || apt_missing+=(libssl-dev)
# etcd: the Mooncake Store HA test runs two masters electing a leader through it.
command -v etcd >/dev/null || apt_missing+=(etcd-server)
# pyverbs (RDMA transport): present so the no-device path is what the tests exercise.
[ -d /usr/lib/python3/dist-packages/pyverbs ] || apt_missing+=(python3-pyverbs)
if [ ${#apt_missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${apt_missing[*]}"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)

# torchvision must match torch exactly: sglang's host-pool import chain loads it.
say "installing torch"
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1
say "installing sglang 0.5.23 (no-deps) and the dependencies its HiCache path imports"
"${PIP[@]}" --no-deps sglang==0.5.23
"${PIP[@]}" -c <(echo torch==2.14.1) numpy psutil requests msgspec orjson pybase64 packaging pillow \
  starlette pydantic pyzmq tqdm IPython aiohttp transformers==5.19.0 dill apache-tvm-ffi==0.1.11 \
  sentencepiece compressed-tensors gguf
say "installing the pure-Python requirements sglang's server imports (not its GPU kernels)"
# A live CPU server imports much more than the HiCache path: fastapi, uvicorn, xgrammar, outlines,
# openai, setproctitle, soundfile... Taken from sglang's own metadata, less what needs CUDA or is
# pinned above, so the list follows the installed sglang.
"$VENV/bin/python" - >"$VENV/sglang-server-requirements.txt" <<'PY'
import importlib.metadata as md, re
from packaging.requirements import Requirement
gpu_or_pinned = re.compile(r"^(cuda-python|flash-attn|flashinfer|humming-kernels|kernels|nvidia-|nvshmem|"
                           r"quack-kernels|sgl-|sglang-kernel|tilelang|torch|deepseek-recipe|tml-renderers|"
                           r"py-spy)", re.I)
for line in md.requires("sglang") or []:
    req = Requirement(line)
    if (req.marker is None or req.marker.evaluate({"extra": ""})) and not gpu_or_pinned.match(req.name):
        print(str(req).split(";")[0])
PY
"${PIP[@]}" -c <(printf 'torch==2.14.1\ntorchvision==0.29.1\n') -r "$VENV/sglang-server-requirements.txt"
say "installing the real Mooncake Store wheel (mooncake_master, MooncakeDistributedStore)"
"${PIP[@]}" --no-deps mooncake-transfer-engine-non-cuda==0.3.13.post1
# SGLang's router (Rust, one abi3 wheel; its Python deps are among sglang's): the test cluster puts it
# in front of its servers (devtools/testing/cluster.py, scripts/bench_cluster.py).
"${PIP[@]}" sglang-router==0.3.2
say "installing mooncake-sgl (editable) with its dev and bench extras"
"${PIP[@]}" -c <(echo torch==2.14.1) -e ".[dev,bench]"
# What the tests, the benchmarks, serve_cpu.sh and the main job run SGLang on the CPU with (off
# unless MOONCAKE_SGL_CPU_ADAPTATIONS=1; docs/cpu-hosts.md). No deps: its two are installed above.
say "installing mooncake-sgl-cpu (editable), the CPU-host adaptations"
"${PIP[@]}" --no-deps -e cpu_host
# NVIDIA Dynamo's standalone KV indexer, the real consumer of our router events
# (tests/hicache/test_router_indexer.py, tests/live/test_live_router_events.py, scripts/bench_router.py).
# A virtualenv of its own: it pins pydantic<=2.13.5, older than what sglang needs.
DYNAMO=${MOONCAKE_SGL_DYNAMO_VENV:-.venv-dynamo}
if ! "$DYNAMO/bin/python" -c "import dynamo.indexer" 2>/dev/null; then
  say "creating $DYNAMO with Dynamo's KV indexer (ai-dynamo-runtime 1.6.1)"
  "$PY" -m venv "$DYNAMO"
  "$DYNAMO/bin/pip" install -q --disable-pip-version-check ai-dynamo-runtime==1.6.1
fi
rm -f "$VENV"/.bootstrap-*
touch "$stamp"
say "done"
