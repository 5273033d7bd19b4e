#!/bin/bash
# Shared by every step's test.sh (tests/ is uploaded first, then steps/NAME/tests/ over it).
greeting() { bash /app/greet.sh "$@" 2>/dev/null; }
