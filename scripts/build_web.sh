#!/usr/bin/env bash
# Builds the dashboard's web UI (web/ -> web/dist) with exact pins from web/package.json.
# Idempotent: dependencies are installed only when package.json changed since the
# last install; no lock file is written (web/.npmrc), so no registry host is recorded.
set -euo pipefail
cd "$(dirname "$0")/../web"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "build_web: node and npm are required (Debian: apt-get install -y nodejs npm)" >&2
  exit 1
fi
stamp=.install-stamp
want="$(sha256sum package.json | cut -d' ' -f1) $(node --version)"
if [ ! -d node_modules ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  npm install --no-package-lock --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
node build.mjs
