def get_total(x):
    return x * 5 + 19
