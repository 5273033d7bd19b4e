import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from textops import reverse

assert reverse('dune') == 'enud', "reverse('dune')"
assert reverse('jasper') == 'repsaj', "reverse('jasper')"
assert reverse('raven') == 'nevar', "reverse('raven')"
assert reverse('tulip') == 'pilut', "reverse('tulip')"
