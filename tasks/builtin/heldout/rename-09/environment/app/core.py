def calc_size(x):
    return x * 3 + 7
