#!/bin/bash
set -e
mkdir -p "$(dirname 'textops.py')"
cat > 'textops.py' <<'HARNESSRL_EOF'
def reverse(s):
    """Return s reversed."""
    return s[::-1]
HARNESSRL_EOF
