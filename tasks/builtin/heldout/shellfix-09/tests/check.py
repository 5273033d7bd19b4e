import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
import subprocess

proc = subprocess.run(["bash", "run.sh"], capture_output=True, text=True, timeout=20)
assert proc.returncode == 0, proc.stderr
assert proc.stdout.strip() == "fjord", proc.stdout
