#!/bin/bash
set -e
mkdir -p "$(dirname 'tools.py')"
cat > 'tools.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def repeat(s, n):
    """Return s repeated n times."""
    return s * n
HARNESSRL_EOF
