#!/bin/bash
set -e
mkdir -p "$(dirname 'share/garnet.txt')"
cat > 'share/garnet.txt' <<'HARNESSRL_EOF'
juniper pepper
nectar tulip
velvet pepper
HARNESSRL_EOF
