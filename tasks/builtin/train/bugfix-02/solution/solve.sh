#!/bin/bash
set -e
mkdir -p "$(dirname 'tools.py')"
cat > 'tools.py' <<'HARNESSRL_EOF'
def first_char(s):
    """Return the first character of s."""
    return s[0]
HARNESSRL_EOF
