#!/bin/bash
set -e
mkdir -p "$(dirname 'docs/delta.txt')"
cat > 'docs/delta.txt' <<'HARNESSRL_EOF'
tulip maple
fjord maple
garnet banana
HARNESSRL_EOF
