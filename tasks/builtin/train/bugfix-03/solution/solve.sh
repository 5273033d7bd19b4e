#!/bin/bash
set -e
mkdir -p "$(dirname 'utils.py')"
cat > 'utils.py' <<'HARNESSRL_EOF'
def word_count(text):
    """Return the number of words in text."""
    return len(text.split())
HARNESSRL_EOF
