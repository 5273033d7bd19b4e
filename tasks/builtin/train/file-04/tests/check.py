import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'logs/banana.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'kettle ember\npepper grove\nindigo delta', repr(text)
