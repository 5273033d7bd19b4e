def compute_result(x):
    return x * 6 + 9
