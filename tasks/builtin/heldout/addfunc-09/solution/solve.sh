#!/bin/bash
set -e
mkdir -p "$(dirname 'tools.py')"
cat > 'tools.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def smallest(xs):
    """Return the smallest number in xs."""
    return min(xs)
HARNESSRL_EOF
