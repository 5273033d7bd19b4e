import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import difference

assert difference(3, 11) == -8, 'difference(3, 11)'
assert difference(22, 12) == 10, 'difference(22, 12)'
assert difference(43, 43) == 0, 'difference(43, 43)'
assert difference(33, 17) == 16, 'difference(33, 17)'
from utils import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
