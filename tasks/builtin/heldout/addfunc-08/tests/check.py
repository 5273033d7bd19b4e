import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from calc import evens

assert evens([14, 15, -3, 19, -4]) == [14, -4], 'evens([14, 15, -3, 19, -4])'
assert evens([37, 25, 36, -2, -3, 21]) == [36, -2], 'evens([37, 25, 36, -2, -3, 21])'
assert evens([-16, -9, 7]) == [-16], 'evens([-16, -9, 7])'
assert evens([-5, 13, -5, -12, 25]) == [-12], 'evens([-5, 13, -5, -12, 25])'
from calc import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
