#!/usr/bin/env bash
# The test suite: set up what is missing, lint, then every test (SGLang integration and the real
# mooncake_master included; nothing here needs a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check mooncake_sgl scripts tests
exec .venv/bin/python -m pytest -q "$@"
