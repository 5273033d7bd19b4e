#!/bin/bash
set -e
mkdir -p "$(dirname 'core.py')"
cat > 'core.py' <<'HARNESSRL_EOF'
def square(x):
    """Return x squared."""
    return x * x
HARNESSRL_EOF
