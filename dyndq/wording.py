"""Small helpers for messages in plain English."""
from __future__ import annotations


def a(word: str) -> str:
    """`word` with its article: "an int8", "a uint8", "an INT", "a float32", "an optional"."""
    w = str(word)
    low = w.lower()
    vowel = low[:1] in ("a", "e", "i", "o") or (low[:1] == "u" and not low.startswith(("uint", "uni", "use")))
    return f"{'an' if vowel else 'a'} {w}"


def os_error(e: OSError) -> str:
    """An OSError as "PATH: reason", without Python's "[Errno 13]" prefix."""
    reason = e.strerror or str(e)
    return f"{e.filename}: {reason}" if e.filename else reason
