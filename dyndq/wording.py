"""Small helpers for messages in plain English."""
from __future__ import annotations

import re
import textwrap


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


def cut(text, limit: int = 80) -> str:
    """`text` as a message shows a name it was given: whole when it has at most `limit`
    characters, else its start and end around "..." and its length, so that a message names
    what it is about without echoing megabytes of it."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = max(limit - 40, 8)
    return f"{text[:head]}...{text[-12:]} ({len(text):,} characters)"


def first_line(e: BaseException) -> str:
    """An exception's message, first line only (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def engine_error(e: BaseException) -> str:
    """An engine's error in one line, for a user: ONNX Runtime's without its "[ONNXRuntimeError] :
    1 : FAIL :" prefix; OpenVINO's (many lines: where it was thrown, the check, then what failed)
    its last line that says what failed. The one cleaner for the parity check and the CLI."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    frames = ("Exception from", "Check '", "FrontEnd API failed", "Model wasn't", "Summary:", "-- Conversion",
              "While validating")
    said = [line for line in lines if not line.startswith(frames)]
    text = said[-1] if said and len(lines) > 1 else (lines[0] if lines else type(e).__name__)
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)


def table(header: list[str], rows: list[list[str]], wrap: int = 56) -> list[str]:
    """Aligned columns under a header and a rule, indented by two; the last column (a
    description) wraps at `wrap` characters."""
    wrapped = [r[:-1] + [textwrap.wrap(str(r[-1]), wrap) or [""]] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header[:-1], *(r[:-1] for r in wrapped))]
    last = max([len(header[-1])] + [len(x) for r in wrapped for x in r[-1]])

    def line(cells):
        return ("  " + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths + [0]))).rstrip()

    out = [line(header), line(["-" * w for w in widths + [last]])]
    for r in wrapped:
        out.append(line(r[:-1] + [r[-1][0]]))
        out += [line([""] * len(widths) + [more]) for more in r[-1][1:]]
    return out
