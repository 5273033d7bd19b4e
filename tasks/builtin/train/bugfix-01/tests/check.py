import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from textops import reverse

assert reverse('dune') == 'enud', "reverse('dune')"
assert reverse('jasper') == 'repsaj', "reverse('jasper')"
assert reverse('raven') == 'nevar', "reverse('raven')"
assert reverse('tulip') == 'pilut', "reverse('tulip')"

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
