import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from numlib import count_vowels

assert count_vowels('falcon') == 2, "count_vowels('falcon')"
assert count_vowels('zephyr') == 1, "count_vowels('zephyr')"
assert count_vowels('kettle') == 2, "count_vowels('kettle')"
assert count_vowels('quartz') == 2, "count_vowels('quartz')"
from numlib import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
