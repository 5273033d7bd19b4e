import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("core.py", "main.py", "report.py"):
    assert not re.search(r"\bcalc_size\b", open(path).read()), f"calc_size is still used in {path}"
import core
import report

assert core.load_size(3) == 16
assert report.summary() == 28
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "25", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
