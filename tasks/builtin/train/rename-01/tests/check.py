import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("calc.py", "main.py", "report.py"):
    assert not re.search(r"\bget_total\b", open(path).read()), f"get_total is still used in {path}"
import calc
import report

assert calc.compute_total(3) == 34
assert report.summary() == 164
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "159", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
