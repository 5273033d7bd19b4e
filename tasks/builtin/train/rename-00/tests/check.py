import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("numlib.py", "main.py", "report.py"):
    assert not re.search(r"\bcompute_result\b", open(path).read()), f"compute_result is still used in {path}"
import numlib
import report

assert numlib.calc_result(3) == 27
assert report.summary() == 117
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "111", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
