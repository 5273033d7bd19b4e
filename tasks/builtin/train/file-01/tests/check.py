import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'out/kiwi.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'jasper juniper\npepper heron', repr(text)
