import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'res/tulip.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'iris amber\nfjord lotus', repr(text)
