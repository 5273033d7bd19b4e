import calc


def summary():
    return calc.compute_rate(8)
