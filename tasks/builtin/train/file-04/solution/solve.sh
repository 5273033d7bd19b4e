#!/bin/bash
set -e
mkdir -p "$(dirname 'logs/banana.txt')"
cat > 'logs/banana.txt' <<'HARNESSRL_EOF'
kettle ember
pepper grove
indigo delta
HARNESSRL_EOF
