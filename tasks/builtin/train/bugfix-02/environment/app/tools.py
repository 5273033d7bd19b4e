def first_char(s):
    """Return the first character of s."""
    return s[1]
