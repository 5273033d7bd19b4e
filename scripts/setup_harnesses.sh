#!/usr/bin/env bash
# Installs the built-in real harnesses, unmodified, into a project-local prefix
# ($HARNESSRL_TOOLS_DIR, default $HARNESSRL_HOME/tools): Claude Code, OpenCode
# and Codex from npm; mini-swe-agent (Python 3.11) and the OpenHands SDK
# (Python 3.12) in venvs of their own. Idempotent (stamps).
#
#   scripts/setup_harnesses.sh [NAME...]   NAME: claude-code, opencode, codex, mini-swe-agent,
#                                          openhands-sdk, node-runtime; none: all of them
#
# `harnessrl harness install NAME|all` calls it for the built-in ones (scripts/setup: the
# default harness and what a config names); harnesses declared in TOML files install there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export HARNESSRL_HOME="${HARNESSRL_HOME:-$ROOT/.harnessrl}"
TOOLS="${HARNESSRL_TOOLS_DIR:-$HARNESSRL_HOME/tools}"
STAMPS="$TOOLS/.stamps"
mkdir -p "$TOOLS" "$STAMPS"

# Exact versions; the sandbox's adapters expect these (preflight checks them).
CLAUDE_CODE_VERSION=2.1.332
OPENCODE_VERSION=1.18.33
CODEX_VERSION=0.171.0
MINI_SWE_AGENT_VERSION=2.4.6
OPENHANDS_VERSION=1.58.2

step() { printf '==> %s\n' "$*" >&2; }
done_with() { [[ -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]; }
mark() { printf '%s' "$2" >"$STAMPS/$1"; }

# npm_harness NAME PACKAGE@VERSION BIN: one package into the shared prefix $TOOLS/npm (npm keeps
# the others: each is in the prefix's package.json), stamped on its own.
npm_harness() {
  local name=$1 spec=$2 bin=$3
  done_with "npm-$name" "$spec" && [[ -e "$TOOLS/npm/node_modules/.bin/$bin" ]] && return
  step "npm: $spec"
  mkdir -p "$TOOLS/npm"
  npm install --prefix "$TOOLS/npm" --no-audit --no-fund --no-package-lock --loglevel=error "$spec"
  mark "npm-$name" "$spec"
}

# bundle NAME BINARY STAMP: a self-contained copy of BINARY under $TOOLS/runtime/NAME: the
# binary, every library it links and the dynamic loader, with the loader and library path
# patched to point inside the bundle, so it runs in a task's container whatever that image
# holds (or lacks). Mounted read-only there, at the same path.
bundle() {
  local name=$1 bin out key loader exe
  bin="$(readlink -f "$2")"
  exe="$(basename "$2")"
  out="$TOOLS/runtime/$name"
  key="$(sha256sum "$bin" | cut -c1-16)"
  done_with "$3" "$key" && [[ -x "$out/bin/$exe" ]] && return
  step "$name runtime: $bin"
  command -v patchelf >/dev/null || { echo "setup: patchelf is missing (Debian package patchelf)" >&2; return 1; }
  rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
  cp "$bin" "$out/bin/$exe"
  ldd "$bin" | awk '/=> \//{print $3} /^\s*\/.*ld-linux/{print $1}' | while read -r lib; do
    cp -L "$lib" "$out/lib/"
  done
  loader="$(basename "$(patchelf --print-interpreter "$bin")")"
  patchelf --set-interpreter "$out/lib/$loader" --set-rpath "$out/lib" "$out/bin/$exe"
  "$out/bin/$exe" --version >/dev/null
  mark "$3" "$key"
}

# A self-contained Node.js for harnesses that run on node (Codex's launcher).
node_runtime() {
  bundle node "$(command -v node)" node-runtime
}

# A self-contained ripgrep (Debian package ripgrep) for OpenCode: its grep, glob and skill
# tools run `rg`, and it downloads ripgrep at run time when it finds none (a sandbox has no
# network). The adapter puts this one where OpenCode looks before downloading.
ripgrep_runtime() {
  command -v rg >/dev/null || { echo "setup: ripgrep is missing (Debian package ripgrep; scripts/setup installs it)" >&2; return 1; }
  bundle ripgrep "$(command -v rg)" ripgrep-runtime
}

# A Python 3.12 interpreter (OpenHands SDK needs it): on PATH, or a pyenv build.
python312() {
  local c
  for c in "${PYTHON312:-}" python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    if [[ -n "$c" ]] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then echo "$c"; return; fi
  done
  echo "setup: no Python 3.12 found (needed by the OpenHands SDK); install one or set SETUP_SKIP_HARNESSES=1" >&2
  return 1
}

python_harness() { # NAME PYTHON PACKAGES...
  local name=$1 python=$2; shift 2
  local key="$*"
  done_with "$name" "$key" && [[ -x "$TOOLS/$name/bin/python" ]] && return
  step "$name: $*"
  rm -rf "$TOOLS/$name"
  "$python" -m venv "$TOOLS/$name"
  "$TOOLS/$name/bin/python" -m pip install -q --upgrade pip
  "$TOOLS/$name/bin/python" -m pip install -q "$@"
  mark "$name" "$key"
}

install_one() {
  case "$1" in
    claude-code) npm_harness claude-code "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" claude && node_runtime ;;
    opencode) npm_harness opencode "opencode-ai@$OPENCODE_VERSION" opencode && node_runtime && ripgrep_runtime ;;
    codex) npm_harness codex "@openai/codex@$CODEX_VERSION" codex && node_runtime ;;
    node-runtime) node_runtime ;;
    mini-swe-agent) python_harness mini-swe-agent "${PYTHON311:-python3.11}" "mini-swe-agent==$MINI_SWE_AGENT_VERSION" ;;
    # The OpenHands SDK needs Python >= 3.12.
    openhands-sdk)
      python_harness openhands "$(python312)" "openhands-sdk==$OPENHANDS_VERSION" "openhands-tools==$OPENHANDS_VERSION" ;;
    *) echo "setup_harnesses.sh: unknown harness '$1'; built-in: claude-code opencode codex mini-swe-agent openhands-sdk node-runtime" >&2
       return 2 ;;
  esac
}

(($#)) || set -- claude-code opencode codex mini-swe-agent openhands-sdk
for name in "$@"; do install_one "$name"; done
