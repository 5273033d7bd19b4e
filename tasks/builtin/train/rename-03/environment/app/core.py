def build_value(x):
    return x * 5 + 2
