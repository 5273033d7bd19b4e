def compute_rate(x):
    return x * 6 + 16
