#!/bin/bash
set -e
mkdir -p "$(dirname 'helpers.py')"
cat > 'helpers.py' <<'HARNESSRL_EOF'
def find_rate(x):
    return x * 6 + 3
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from helpers import find_rate

print(find_rate(24))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import helpers


def summary():
    return helpers.find_rate(25)
HARNESSRL_EOF
