import calc


def summary():
    return calc.calc_total(24)
