import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from tools import smallest

assert smallest([-4, 14, -18, 3, 27]) == -18, 'smallest([-4, 14, -18, 3, 27])'
assert smallest([-7, 6, 37]) == -7, 'smallest([-7, 6, 37])'
assert smallest([1, 27, 17, -18, -1]) == -18, 'smallest([1, 27, 17, -18, -1])'
assert smallest([9, 20, 28, 26]) == 9, 'smallest([9, 20, 28, 26])'
from tools import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
