def last_item(xs):
    """Return the last element of xs."""
    return xs[0]
