#!/bin/bash
set -e
mkdir -p "$(dirname 'textops.py')"
cat > 'textops.py' <<'HARNESSRL_EOF'
def cube(x):
    """Return x cubed."""
    return x ** 3
HARNESSRL_EOF
