#!/bin/bash
set -e
mkdir -p "$(dirname 'utils.py')"
cat > 'utils.py' <<'HARNESSRL_EOF'
def add(a, b):
    """Return the sum of a and b."""
    return a + b
HARNESSRL_EOF
