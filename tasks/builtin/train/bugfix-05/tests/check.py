import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from calc import area

assert area(30, 11) == 330, 'area(30, 11)'
assert area(9, 27) == 243, 'area(9, 27)'
assert area(41, 50) == 2050, 'area(41, 50)'
assert area(47, 33) == 1551, 'area(47, 33)'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
