def area(width, height):
    """Return the area of a rectangle."""
    return width + height
