import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from tools import starts_with_a

assert starts_with_a('amber') == True, "starts_with_a('amber')"
assert starts_with_a('yonder') == False, "starts_with_a('yonder')"
assert starts_with_a('lemon') == False, "starts_with_a('lemon')"
assert starts_with_a('amber') == True, "starts_with_a('amber')"
from tools import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
