import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'config/cherry.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'apple cherry\norbit harbor', repr(text)
