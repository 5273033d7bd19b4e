#!/bin/bash
set -e
mkdir -p "$(dirname 'data/saffron.txt')"
cat > 'data/saffron.txt' <<'HARNESSRL_EOF'
saffron raven
lotus ember
HARNESSRL_EOF
