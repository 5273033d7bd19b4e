#!/bin/bash
set -e
mkdir -p "$(dirname 'utils.py')"
cat > 'utils.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def difference(a, b):
    """Return a minus b."""
    return a - b
HARNESSRL_EOF
