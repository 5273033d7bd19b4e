#!/bin/bash
set -e
mkdir -p "$(dirname 'numlib.py')"
cat > 'numlib.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def count_vowels(s):
    """Return how many vowels (a, e, i, o, u) s has."""
    return sum(c in "aeiou" for c in s)
HARNESSRL_EOF
