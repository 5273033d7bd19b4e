import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import add

assert add(31, 18) == 49, 'add(31, 18)'
assert add(29, 42) == 71, 'add(29, 42)'
assert add(36, 12) == 48, 'add(36, 12)'
assert add(23, 33) == 56, 'add(23, 33)'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
