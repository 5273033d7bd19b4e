import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
path = 'drafts/zephyr.txt'
assert os.path.isfile(path), f"{path} is missing"
text = open(path).read()
assert text.rstrip("\n") == 'raven iris\norbit jasper\ncedar raven', repr(text)
