#!/bin/bash
# Step 'greet': reward 1 when greet.sh prints hello.
source /tests/lib.sh
if [ "$(greeting)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
