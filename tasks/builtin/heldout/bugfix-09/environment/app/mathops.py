def shout(text):
    """Return text in upper case followed by '!'."""
    return text + "!"
