import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from textops import last_item

assert last_item([-2, 39, 35]) == 35, 'last_item([-2, 39, 35])'
assert last_item([-1, 28, 18, 26]) == 26, 'last_item([-1, 28, 18, 26])'
assert last_item([-15, 5, 24, -3, 36]) == 36, 'last_item([-15, 5, 24, -3, 36])'
assert last_item([4, 37, 28, 18, 19]) == 19, 'last_item([4, 37, 28, 18, 19])'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
