#!/bin/bash
# Step 'personalise': 'reward' needs both forms; 'kept' says the first step's behaviour survived.
source /tests/lib.sh
named=0; plain=0
[ "$(greeting "$GREETING_NAME")" = "hello $GREETING_NAME" ] && named=1
[ "$(greeting)" = "hello" ] && plain=1
echo "{\"reward\": $((named * plain)), \"kept\": $plain}" > /logs/verifier/reward.json
