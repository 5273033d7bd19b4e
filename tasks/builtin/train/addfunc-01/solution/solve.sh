#!/bin/bash
set -e
mkdir -p "$(dirname 'utils.py')"
cat > 'utils.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def is_palindrome(s):
    """Return True when s reads the same backwards."""
    return s == s[::-1]
HARNESSRL_EOF
