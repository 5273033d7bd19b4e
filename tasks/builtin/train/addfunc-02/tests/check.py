import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from tools import repeat

assert repeat('cedar', 3) == 'cedarcedarcedar', "repeat('cedar', 3)"
assert repeat('kettle', 3) == 'kettlekettlekettle', "repeat('kettle', 3)"
assert repeat('zephyr', 2) == 'zephyrzephyr', "repeat('zephyr', 2)"
assert repeat('iris', 2) == 'irisiris', "repeat('iris', 2)"
from tools import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
