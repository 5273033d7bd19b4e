import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from core import double

assert double(31) == 62, 'double(31)'
assert double(43) == 86, 'double(43)'
assert double(21) == 42, 'double(21)'
assert double(31) == 62, 'double(31)'
from core import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
