#!/bin/bash
set -e
mkdir -p "$(dirname 'calc.py')"
cat > 'calc.py' <<'HARNESSRL_EOF'
def compute_total(x):
    return x * 5 + 19
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from calc import compute_total

print(compute_total(28))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import calc


def summary():
    return calc.compute_total(29)
HARNESSRL_EOF
