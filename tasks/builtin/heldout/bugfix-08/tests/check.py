import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from textops import cube

assert cube(2) == 8, 'cube(2)'
assert cube(7) == 343, 'cube(7)'
assert cube(7) == 343, 'cube(7)'
assert cube(3) == 27, 'cube(3)'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
