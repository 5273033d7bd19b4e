import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from tools import largest

assert largest([-8, -12, 37]) == 37, 'largest([-8, -12, 37])'
assert largest([22, -5, 15, -12, 8, 19]) == 22, 'largest([22, -5, 15, -12, 8, 19])'
assert largest([24, -10, 3, -16]) == 24, 'largest([24, -10, 3, -16])'
assert largest([20, 2, 7, 9]) == 20, 'largest([20, 2, 7, 9])'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
