import os
import sys

os.chdir("/app")
sys.path.insert(0, "/app")
from mathops import shout

assert shout('quartz') == 'QUARTZ!', "shout('quartz')"
assert shout('garnet') == 'GARNET!', "shout('garnet')"
assert shout('falcon') == 'FALCON!', "shout('falcon')"
assert shout('saffron') == 'SAFFRON!', "shout('saffron')"
