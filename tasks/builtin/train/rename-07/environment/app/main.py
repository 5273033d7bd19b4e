from helpers import get_rate

print(get_rate(24))
