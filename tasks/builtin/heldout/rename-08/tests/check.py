import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("calc.py", "main.py", "report.py"):
    assert not re.search(r"\bbuild_score\b", open(path).read()), f"build_score is still used in {path}"
import calc
import report

assert calc.make_score(3) == 34
assert report.summary() == 184
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "178", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
