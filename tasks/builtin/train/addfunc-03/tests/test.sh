#!/bin/bash
# Reward 1 when the checks in check.py pass against /app, else 0.
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if PYTHONDONTWRITEBYTECODE=1 python3 /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
