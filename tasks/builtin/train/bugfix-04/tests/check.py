import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from core import is_even

assert is_even(13) == False, 'is_even(13)'
assert is_even(19) == False, 'is_even(19)'
assert is_even(40) == True, 'is_even(40)'
assert is_even(42) == True, 'is_even(42)'

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
