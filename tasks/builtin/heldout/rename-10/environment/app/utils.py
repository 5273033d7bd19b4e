def build_result(x):
    return x * 3 + 12
