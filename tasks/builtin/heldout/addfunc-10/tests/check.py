import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import difference

assert difference(3, 11) == -8, 'difference(3, 11)'
assert difference(22, 12) == 10, 'difference(22, 12)'
assert difference(43, 43) == 0, 'difference(43, 43)'
assert difference(33, 17) == 16, 'difference(33, 17)'
from utils import identity

assert identity(5) == 5
