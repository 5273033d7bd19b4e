def build_score(x):
    return x * 6 + 16
