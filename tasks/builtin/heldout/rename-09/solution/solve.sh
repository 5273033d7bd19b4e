#!/bin/bash
set -e
mkdir -p "$(dirname 'core.py')"
cat > 'core.py' <<'HARNESSRL_EOF'
def load_size(x):
    return x * 3 + 7
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from core import load_size

print(load_size(6))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import core


def summary():
    return core.load_size(7)
HARNESSRL_EOF
