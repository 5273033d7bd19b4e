#!/bin/bash
set -e
mkdir -p "$(dirname 'core.py')"
cat > 'core.py' <<'HARNESSRL_EOF'
def compute_value(x):
    return x * 5 + 2
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from core import compute_value

print(compute_value(28))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import core


def summary():
    return core.compute_value(29)
HARNESSRL_EOF
