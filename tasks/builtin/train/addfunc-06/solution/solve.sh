#!/bin/bash
set -e
mkdir -p "$(dirname 'tools.py')"
cat > 'tools.py' <<'HARNESSRL_EOF'
def identity(x):
    """Return x unchanged."""
    return x


def join_words(words):
    """Return the words joined by single spaces."""
    return " ".join(words)
HARNESSRL_EOF
