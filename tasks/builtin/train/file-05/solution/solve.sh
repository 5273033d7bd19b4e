#!/bin/bash
set -e
mkdir -p "$(dirname 'config/cherry.txt')"
cat > 'config/cherry.txt' <<'HARNESSRL_EOF'
apple cherry
orbit harbor
HARNESSRL_EOF
