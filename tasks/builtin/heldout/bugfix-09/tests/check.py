import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from mathops import shout

assert shout('quartz') == 'QUARTZ!', "shout('quartz')"
assert shout('garnet') == 'GARNET!', "shout('garnet')"
assert shout('falcon') == 'FALCON!', "shout('falcon')"
assert shout('saffron') == 'SAFFRON!', "shout('saffron')"

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
