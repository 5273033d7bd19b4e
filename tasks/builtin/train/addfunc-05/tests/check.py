import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import total

assert total([30, 4, -8]) == 26, 'total([30, 4, -8])'
assert total([-14, 19, -19, 37]) == 23, 'total([-14, 19, -19, 37])'
assert total([2, -11, -4, -9]) == -22, 'total([2, -11, -4, -9])'
assert total([34, 5, 8]) == 47, 'total([34, 5, 8])'
from utils import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
