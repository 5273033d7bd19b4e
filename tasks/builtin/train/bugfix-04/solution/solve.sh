#!/bin/bash
set -e
mkdir -p "$(dirname 'core.py')"
cat > 'core.py' <<'HARNESSRL_EOF'
def is_even(n):
    """Return True when n is even."""
    return n % 2 == 0
HARNESSRL_EOF
