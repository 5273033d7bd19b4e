#!/bin/bash
set -e
mkdir -p "$(dirname 'tools.py')"
cat > 'tools.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def starts_with_a(s):
    """Return True when s starts with the letter a."""
    return s.startswith("a")
HARNESSRL_EOF
