#!/bin/bash
set -e
mkdir -p "$(dirname 'core.py')"
cat > 'core.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def double(x):
    """Return x multiplied by 2."""
    return x * 2
HARNESSRL_EOF
