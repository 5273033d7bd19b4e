#!/bin/bash
set -e
mkdir -p "$(dirname 'calc.py')"
cat > 'calc.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def evens(xs):
    """Return the even numbers of xs, in order."""
    return [x for x in xs if x % 2 == 0]
HARNESSRL_EOF
