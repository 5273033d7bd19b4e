import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from core import triple

assert triple(37) == 111, 'triple(37)'
assert triple(37) == 111, 'triple(37)'
assert triple(50) == 150, 'triple(50)'
assert triple(49) == 147, 'triple(49)'
from core import identity

assert identity(5) == 5
