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


def plural(n: int, word: str) -> str:
    """"1 problem", "2 problems"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def problem_list(head: str, problems, *, item: str = "") -> str:
    """Every problem under one heading, the one way the CLI and the demo print them:
    "HEAD: 2 problems" then "  - ITEM problem" per line."""
    return "\n".join([f"{head}: {plural(len(problems), 'problem')}"] + [f"  - {item}{p}" for p in problems])


def first_line(e: BaseException) -> str:
    """An exception's message, first line only (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
