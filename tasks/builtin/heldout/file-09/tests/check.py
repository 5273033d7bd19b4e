import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'docs/delta.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'tulip maple\nfjord maple\ngarnet banana', repr(text)
