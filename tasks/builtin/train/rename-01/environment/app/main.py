from calc import get_total

print(get_total(28))
