import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'lists/birch.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'raven saffron\nlemon orbit', repr(text)
