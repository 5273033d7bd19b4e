import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from tools import join_words

assert join_words(['dune', 'birch', 'juniper']) == 'dune birch juniper', "join_words(['dune', 'birch', 'juniper'])"
assert join_words(['tulip', 'falcon', 'lotus']) == 'tulip falcon lotus', "join_words(['tulip', 'falcon', 'lotus'])"
assert join_words(['raven', 'saffron', 'amber']) == 'raven saffron amber', "join_words(['raven', 'saffron', 'amber'])"
assert join_words(['ember', 'nectar', 'heron']) == 'ember nectar heron', "join_words(['ember', 'nectar', 'heron'])"
from tools import identity

assert identity(5) == 5

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
