import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from utils import is_palindrome

assert is_palindrome('quartz') == False, "is_palindrome('quartz')"
assert is_palindrome('heron') == False, "is_palindrome('heron')"
assert is_palindrome('amber') == False, "is_palindrome('amber')"
assert is_palindrome('mango') == False, "is_palindrome('mango')"
from utils import identity

assert identity(5) == 5
