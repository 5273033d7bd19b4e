#!/bin/bash
set -e
mkdir -p "$(dirname 'core.py')"
cat > 'core.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def triple(x):
    """Return x multiplied by 3."""
    return x * 3
HARNESSRL_EOF
