#!/bin/bash
set -e
mkdir -p "$(dirname 'drafts/zephyr.txt')"
cat > 'drafts/zephyr.txt' <<'HARNESSRL_EOF'
raven iris
orbit jasper
cedar raven
HARNESSRL_EOF
