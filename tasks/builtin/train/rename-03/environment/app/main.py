from core import build_value

print(build_value(28))
