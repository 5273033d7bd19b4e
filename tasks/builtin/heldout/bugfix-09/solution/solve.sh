#!/bin/bash
set -e
mkdir -p "$(dirname 'mathops.py')"
cat > 'mathops.py' <<'HARNESSRL_EOF'
def shout(text):
    """Return text in upper case followed by '!'."""
    return text.upper() + "!"
HARNESSRL_EOF
