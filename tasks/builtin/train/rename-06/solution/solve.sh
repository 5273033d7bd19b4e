#!/bin/bash
set -e
mkdir -p "$(dirname 'calc.py')"
cat > 'calc.py' <<'HARNESSRL_EOF'
def make_total(x):
    return x * 5 + 20
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from calc import make_total

print(make_total(23))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import calc


def summary():
    return calc.make_total(24)
HARNESSRL_EOF
