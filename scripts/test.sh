#!/usr/bin/env bash
# The test suite: set up what is missing, lint, then every test (SGLang integration and the real
# mooncake_master included; nothing here needs a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check mooncake_sgl devtools scripts tests
# The Mooncake Store HA fail-over test (two masters, etcd; about a minute) is opt-in for quick
# local runs and always on here.
export MOONCAKE_SGL_TEST_HA="${MOONCAKE_SGL_TEST_HA:-1}"
exec .venv/bin/python -m pytest -q "$@"
