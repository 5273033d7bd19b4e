#!/bin/bash
set -e
mkdir -p "$(dirname 'out/kiwi.txt')"
cat > 'out/kiwi.txt' <<'HARNESSRL_EOF'
jasper juniper
pepper heron
HARNESSRL_EOF
