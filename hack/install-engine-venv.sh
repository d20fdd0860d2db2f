#!/usr/bin/env bash
# Installs the real vLLM and SGLang releases into an isolated virtual environment, for the
# conformance tests (tests/integration/test_engine_conformance.py) that feed every rendered
# command line to the engines' own argument parsers. Never touches the project's interpreter:
# vLLM pins torch and transformers versions of its own.
#
# Only what the parsers import is installed: the engine wheels and torch with --no-deps, then the
# CUDA runtime libraries torch loads at import (no GPU is needed; PyPI has no CPU-only torch and
# download.pytorch.org is not reachable here) and the Python modules the parsers import.
# Idempotent and fast when cached: a stamp file records what was installed.
#
# Environment: LOOKAHEAD_ENGINES_VENV (default ~/.cache/lookahead-rollout/engines-venv), PY.
set -euo pipefail

VLLM_VERSION=0.33.0
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.0          # vLLM 0.33.0 pins torch==2.14.0
VENV=${LOOKAHEAD_ENGINES_VENV:-${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/engines-venv}
PY=${PY:-python3}
STAMP="$VENV/.lookahead-engines-stamp"
WANT="vllm==$VLLM_VERSION sglang==$SGLANG_VERSION torch==$TORCH_VERSION deps-v1"

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then
  exit 0
fi

start=$(date +%s)
# run from / : `python -m pip` puts the working directory on sys.path, and this repo's operator/
# package would shadow the standard library's `operator` module
cd /
echo "engines venv: installing $WANT into $VENV" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

# 1. the engines and torch themselves, without their (GPU-kernel) dependency trees
"${PIP[@]}" --no-deps "torch==$TORCH_VERSION" "vllm==$VLLM_VERSION" "sglang==$SGLANG_VERSION"

# 2. torch's CUDA runtime libraries (torch 2.14.0's own pins; loaded at `import torch`)
"${PIP[@]}" "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3" \
  nvidia-cudnn-cu13==9.24.0.43 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.4.5 \
  "setuptools>=77.0.3,<81" typing_extensions sympy networkx filelock jinja2 fsspec

# 3. what vLLM's and SGLang's argument parsers import (found by importing them), at vLLM's pins
"${PIP[@]}" numpy packaging regex pyyaml "pydantic>=2.12" psutil cbor2 pyzmq urllib3 requests \
  "transformers>=5.16.1,<5.21.0" aiohttp openai-harmony openai msgspec cloudpickle pillow pybase64 cachetools \
  uvloop py-cpuinfo "fastapi<0.137.0" prometheus_client partial-json-parser "xgrammar==0.2.8" \
  "llguidance>=1.7.0,<1.8.0" orjson ipython

# smoke test: both parsers import
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'EOF' 2>/dev/null
import os
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.engine.arg_utils import AsyncEngineArgs
from sglang.srt.server_args import prepare_server_args
make_arg_parser(FlexibleArgumentParser())
EOF

echo "$WANT" > "$STAMP"
echo "engines venv: ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)" >&2
