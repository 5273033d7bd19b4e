import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'data/saffron.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'saffron raven\nlotus ember', repr(text)

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
