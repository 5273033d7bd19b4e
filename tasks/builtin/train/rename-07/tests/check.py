import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("helpers.py", "main.py", "report.py"):
    assert not re.search(r"\bget_rate\b", open(path).read()), f"get_rate is still used in {path}"
import helpers
import report

assert helpers.find_rate(3) == 21
assert report.summary() == 153
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "147", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
