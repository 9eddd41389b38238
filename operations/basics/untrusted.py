"""Text a hub or a server wrote, made safe to print on the operator's terminal."""


def printable(value) -> str:
    """`value` as text with every character a terminal would act on (escape sequences, carriage returns,
    newlines, bidirectional overrides: what `str.isprintable` rejects, the space aside) written as its
    Python escape, so a hostile hub's config.json or a server's error prints as what it is.

    **Example:** ``printable("llama\\x1b[2J")`` is ``'llama\\\\x1b[2J'``.
    """
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)
