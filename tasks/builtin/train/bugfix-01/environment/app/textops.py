def reverse(s):
    """Return s reversed."""
    return s[1:]
