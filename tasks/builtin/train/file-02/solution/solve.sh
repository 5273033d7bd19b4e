#!/bin/bash
set -e
mkdir -p "$(dirname 'src/saffron.txt')"
cat > 'src/saffron.txt' <<'HARNESSRL_EOF'
ember harbor
yonder walnut
birch raven
HARNESSRL_EOF
