#!/bin/bash
set -e
mkdir -p "$(dirname 'tools.py')"
cat > 'tools.py' <<'HARNESSRL_EOF'
def largest(xs):
    """Return the largest number in xs."""
    return max(xs)
HARNESSRL_EOF
