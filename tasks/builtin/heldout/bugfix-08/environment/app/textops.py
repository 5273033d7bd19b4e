def cube(x):
    """Return x cubed."""
    return x ** 2
