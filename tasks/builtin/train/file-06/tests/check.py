import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'share/garnet.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'juniper pepper\nnectar tulip\nvelvet pepper', repr(text)
