#!/bin/bash
set -e
mkdir -p "$(dirname 'utils.py')"
cat > 'utils.py' <<'HARNESSRL_EOF'
def count_result(x):
    return x * 3 + 12
HARNESSRL_EOF
mkdir -p "$(dirname 'main.py')"
cat > 'main.py' <<'HARNESSRL_EOF'
from utils import count_result

print(count_result(1))
HARNESSRL_EOF
mkdir -p "$(dirname 'report.py')"
cat > 'report.py' <<'HARNESSRL_EOF'
import utils


def summary():
    return utils.count_result(2)
HARNESSRL_EOF
