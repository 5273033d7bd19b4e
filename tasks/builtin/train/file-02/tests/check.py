import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'src/saffron.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'ember harbor\nyonder walnut\nbirch raven', repr(text)
