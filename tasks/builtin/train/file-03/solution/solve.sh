#!/bin/bash
set -e
mkdir -p "$(dirname 'lists/birch.txt')"
cat > 'lists/birch.txt' <<'HARNESSRL_EOF'
raven saffron
lemon orbit
HARNESSRL_EOF
