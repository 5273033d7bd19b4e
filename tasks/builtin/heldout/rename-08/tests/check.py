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
