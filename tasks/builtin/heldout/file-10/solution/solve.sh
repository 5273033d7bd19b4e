#!/bin/bash
set -e
mkdir -p "$(dirname 'res/tulip.txt')"
cat > 'res/tulip.txt' <<'HARNESSRL_EOF'
iris amber
fjord lotus
HARNESSRL_EOF
