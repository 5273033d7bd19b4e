import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import re
import subprocess

for path in ("textops.py", "main.py", "report.py"):
    assert not re.search(r"\bload_result\b", open(path).read()), f"load_result is still used in {path}"
import textops
import report

assert textops.compute_result(3) == 28
assert report.summary() == 124
out = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, check=True).stdout
assert out.strip() == "116", out

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
