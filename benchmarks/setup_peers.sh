#!/usr/bin/env bash
# Installs the peers that benchmarks/overhead.py, routing_scenarios.py, routing_classes.py and sessions.py
# compare latgate with. Each is optional: a benchmark skips (and says so) any peer that is
# not installed.
#
#   nginx        Debian package (apt-get; root)
#   LiteLLM      proxy, pinned, in its own venv: benchmarks/.peers/litellm
#   vllm-router  Rust router wheel, pinned, in its own venv: benchmarks/.peers/vllm-router
#
# benchmarks/.peers/ is git-ignored (it may be a link to a shared install). Re-running skips
# what is already there, and points the scripts of a venv moved from another path at it.
# Usage: bash benchmarks/setup_peers.sh [nginx] [litellm] [vllm-router]   (default: all)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
peers="$here/.peers"
python="${PYTHON:-python3}"
LITELLM_VERSION="1.108.12"  # 1.108.13+ need a litellm-proxy-extras not on PyPI
VLLM_ROUTER_VERSION="0.1.17"
wanted="${*:-nginx litellm vllm-router}"
mkdir -p "$peers"

want() { [[ " $wanted " == *" $1 "* ]]; }

relocate() {  # relocate NAME: a venv moved, copied or linked from another clone keeps its old shebangs
  local dir real
  dir="$peers/$1"
  real="$(cd "$dir" && pwd -P)"
  { grep -lI '^#!/.*/bin/python' "$dir"/bin/* 2>/dev/null || true; } | while read -r script; do
    if ! head -1 "$script" | grep -q "^#!$real/bin/python"; then
      sed -i "1s|^#!/.*/bin/python[0-9.]*\$|#!$real/bin/python3|" "$script"
      echo "$1: $(basename "$script") now runs $real/bin/python3"
    fi
  done
}

venv_with() {  # venv_with NAME CHECK_BINARY PACKAGE...
  local name="$1" check="$2"
  shift 2
  if [[ -x "$peers/$name/bin/$check" ]]; then
    echo "$name: already installed"
    relocate "$name"
    return
  fi
  echo "$name: installing $* into $peers/$name"
  "$python" -m venv "$peers/$name"
  if ! "$peers/$name/bin/pip" install -q --disable-pip-version-check "$@"; then
    echo "$name: install failed; removed (overhead.py will skip it)"
    rm -rf "${peers:?}/$name"
  fi
}

if want nginx; then
  if command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]]; then
    echo "nginx: already installed"
  elif [[ $(id -u) -eq 0 ]]; then
    echo "nginx: installing the Debian package"
    apt-get update -qq
    # The package's service is not wanted (overhead.py runs nginx with its own config).
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends nginx >/dev/null
  else
    echo "nginx: not installed and not root; skipped"
  fi
fi
if want litellm; then
  # litellm[proxy] pins litellm-enterprise / litellm-proxy-extras builds that the
  # registry may not carry: install litellm and what its proxy server imports instead,
  # with the nearest enterprise/extras builds (their own pins skipped).
  venv_with litellm litellm "litellm==$LITELLM_VERSION" \
    "gunicorn<24" "uvicorn<1" "uvloop<1" "fastapi<1" backoff pyyaml "rq<3" orjson "apscheduler<4" \
    "fastapi-sso<1" "pyjwt<3" "python-multipart<1" cryptography "pynacl<2" "websockets<16" "prometheus-client<1" \
    "rich<14" "tomlkit<1" "restrictedpython<9" "detect-secrets<2" "mcp<3" "expression<6" "soundfile<1"
  if [[ -x "$peers/litellm/bin/pip" ]]; then
    "$peers/litellm/bin/pip" install -q --disable-pip-version-check --no-deps "litellm-proxy-extras<=0.4.110" "litellm-enterprise<=0.1.79.post2" || true
  fi
fi
if want vllm-router; then
  venv_with vllm-router vllm-router "vllm-router==$VLLM_ROUTER_VERSION"
fi
echo "peers ready in $peers"
