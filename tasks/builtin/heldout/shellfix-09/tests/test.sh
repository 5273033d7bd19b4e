#!/bin/bash
# Reward 1 when every check in check.py ran against /app and passed, else 0.
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
rm -f /logs/verifier/checks-passed
if PYTHONDONTWRITEBYTECODE=1 python3 /tests/check.py && [ -f /logs/verifier/checks-passed ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
