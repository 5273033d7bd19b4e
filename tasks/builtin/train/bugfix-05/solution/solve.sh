#!/bin/bash
set -e
mkdir -p "$(dirname 'calc.py')"
cat > 'calc.py' <<'HARNESSRL_EOF'
def area(width, height):
    """Return the area of a rectangle."""
    return width * height
HARNESSRL_EOF
