from core import calc_size

print(calc_size(6))
