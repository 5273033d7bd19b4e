import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import word_count

assert word_count('cherry mango garnet') == 3, "word_count('cherry mango garnet')"
assert word_count('grove lotus') == 2, "word_count('grove lotus')"
assert word_count('lemon birch zephyr juniper') == 4, "word_count('lemon birch zephyr juniper')"
assert word_count('grove raven') == 2, "word_count('grove raven')"

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
