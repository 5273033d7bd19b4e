import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from core import square

assert square(17) == 289, 'square(17)'
assert square(23) == 529, 'square(23)'
assert square(45) == 2025, 'square(45)'
assert square(46) == 2116, 'square(46)'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
