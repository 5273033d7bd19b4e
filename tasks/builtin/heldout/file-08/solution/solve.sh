#!/bin/bash
set -e
mkdir -p "$(dirname 'notes/tulip.txt')"
cat > 'notes/tulip.txt' <<'HARNESSRL_EOF'
kiwi indigo
heron harbor
iris juniper
HARNESSRL_EOF
