import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'notes/tulip.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'kiwi indigo\nheron harbor\niris juniper', repr(text)
