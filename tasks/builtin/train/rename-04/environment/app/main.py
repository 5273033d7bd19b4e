from calc import compute_rate

print(compute_rate(7))
