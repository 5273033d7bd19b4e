def calc_total(x):
    return x * 5 + 20
