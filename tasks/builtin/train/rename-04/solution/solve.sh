#!/bin/bash
set -e
mkdir -p "$(dirname 'calc.py')"
cat > 'calc.py' <<'HARNESSRL_EOF'
def get_rate(x):
    return x * 6 + 16
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from calc import get_rate

print(get_rate(7))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import calc


def summary():
    return calc.get_rate(8)
HARNESSRL_EOF
