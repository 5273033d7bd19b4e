#!/bin/bash
set -e
mkdir -p "$(dirname 'utils.py')"
cat > 'utils.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def total(xs):
    """Return the sum of the numbers in xs."""
    return sum(xs)
HARNESSRL_EOF
