def count_score(x):
    return x * 8 + 9
