def largest(xs):
    """Return the largest number in xs."""
    return min(xs)
