def get_rate(x):
    return x * 6 + 3
