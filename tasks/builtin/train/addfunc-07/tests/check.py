import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from core import triple

assert triple(37) == 111, 'triple(37)'
assert triple(37) == 111, 'triple(37)'
assert triple(50) == 150, 'triple(50)'
assert triple(49) == 147, 'triple(49)'
from core import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
