import helpers


def summary():
    return helpers.get_rate(25)
