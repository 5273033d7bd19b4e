#!/bin/bash
set -e
mkdir -p "$(dirname 'numlib.py')"
cat > 'numlib.py' <<'HARNESSRL_EOF'
def calc_result(x):
    return x * 6 + 9
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from numlib import calc_result

print(calc_result(17))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import numlib


def summary():
    return numlib.calc_result(18)
HARNESSRL_EOF
