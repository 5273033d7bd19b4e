import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import is_palindrome

assert is_palindrome('quartz') == False, "is_palindrome('quartz')"
assert is_palindrome('heron') == False, "is_palindrome('heron')"
assert is_palindrome('amber') == False, "is_palindrome('amber')"
assert is_palindrome('mango') == False, "is_palindrome('mango')"
from utils import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
