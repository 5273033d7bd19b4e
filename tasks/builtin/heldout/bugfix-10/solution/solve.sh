#!/bin/bash
set -e
mkdir -p "$(dirname 'textops.py')"
cat > 'textops.py' <<'HARNESSRL_EOF'
def last_item(xs):
    """Return the last element of xs."""
    return xs[-1]
HARNESSRL_EOF
