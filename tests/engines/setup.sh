#!/usr/bin/env bash
# The engine tier's one-time setup, cached on the machine: the vLLM (CPU) venv and the
# random-weight model, each built once and found again by its versioned folder.
# Usage: setup.sh CACHE_DIR
#   -> prints LATGATE_VLLM_PYTHON=... LATGATE_VLLM_MODEL=... LATGATE_VLLM_LONG_MODEL=...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:?cache dir}"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # two runs at once: the second waits, then finds everything built
python="$(bash "$here/setup_vllm.sh" "$cache")"
model_version="$(sha256sum "$here/build_model.py" | cut -c1-12)"
model="$cache/model-llama-768x12-$model_version"
if [ ! -f "$model/config.json" ]; then
    echo "setup: building the test model in $model" >&2
    "$python" "$here/build_model.py" "$model" >&2
fi
long_model="$cache/model-llama-256x4-8k-$model_version"  # multi-turn histories (prefix caching)
if [ ! -f "$long_model/config.json" ]; then
    echo "setup: building the long-context test model in $long_model" >&2
    "$python" "$here/build_model.py" "$long_model" long >&2
fi
echo "LATGATE_VLLM_PYTHON=$python LATGATE_VLLM_MODEL=$model LATGATE_VLLM_LONG_MODEL=$long_model"
