#!/bin/bash
set -e
mkdir -p "$(dirname 'textops.py')"
cat > 'textops.py' <<'HARNESSRL_EOF'
def compute_result(x):
    return x * 8 + 4
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from textops import compute_result

print(compute_result(14))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import textops


def summary():
    return textops.compute_result(15)
HARNESSRL_EOF
