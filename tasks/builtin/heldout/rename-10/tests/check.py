import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("utils.py", "main.py", "report.py"):
    assert not re.search(r"\bbuild_result\b", open(path).read()), f"build_result is still used in {path}"
import utils
import report

assert utils.count_result(3) == 21
assert report.summary() == 18
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "15", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
