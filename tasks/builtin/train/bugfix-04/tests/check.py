import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from core import is_even

assert is_even(13) == False, 'is_even(13)'
assert is_even(19) == False, 'is_even(19)'
assert is_even(40) == True, 'is_even(40)'
assert is_even(42) == True, 'is_even(42)'
