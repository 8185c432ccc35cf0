"""The one rule for showing a user's value in a message: refusal lines stay one line that a person can read,
whatever the input held (a megabyte of environment, a newline, a lone surrogate from YAML's "\\uD800")."""

import re

# Anything that would break "one line per message" or a terminal: control characters (newlines included) and lone
# surrogates.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
LIMIT = 120


def printable(text: str) -> str:
    """Text with control characters and lone surrogates written as escapes, so that it stays on one line."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def shorten(value: object, limit: int = LIMIT) -> str:
    """`repr(value)` on one line, cut to `limit` characters with the full length said."""
    text = printable(repr(value))
    if len(text) <= limit:
        return text
    full = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:limit]}...{full}"


def quoted(value: object, limit: int = LIMIT) -> str:
    """A value whose type matters to the reader (a YAML scalar: `'2.4'` is not `2.4`), always as its repr."""
    return shorten(value, limit)


def shown(value: object, limit: int = LIMIT) -> str:
    """A string that prints on one line as itself is shown as itself; anything else (other types, unprintable or
    long text) as `shorten` writes it."""
    if isinstance(value, str) and len(value) <= limit and value.isprintable():
        return value
    return shorten(value, limit)
