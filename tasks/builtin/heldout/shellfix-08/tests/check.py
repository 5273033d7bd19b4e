import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import subprocess

proc = subprocess.run(["bash", "run.sh"], capture_output=True, text=True, timeout=20)
assert proc.returncode == 0, proc.stderr
assert proc.stdout.strip() == "indigo", proc.stdout

# Written only when every check above ran (test.sh reads it: an early exit leaves none).
with open("/logs/verifier/checks-passed", "w") as report:
    report.write("all checks ran\n")
