import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from tools import first_char

assert first_char('indigo') == 'i', "first_char('indigo')"
assert first_char('mango') == 'm', "first_char('mango')"
assert first_char('mango') == 'm', "first_char('mango')"
assert first_char('mango') == 'm', "first_char('mango')"

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
