from calc import calc_total

print(calc_total(23))
