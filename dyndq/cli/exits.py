"""The command line's exit codes, and the one mapping from an error to its code and its words.

Every command reports a failure by raising; `main` hands what it raised to `tell`, which looks
its class up in one table (`table()`), prints its message on stderr and returns its exit code
(docs/cli.md gives them):

    0 success, 1 problems found in the model (or an engine cannot run it, or nothing to
    quantize, or a file made from it fails its check as the model itself does), 2 a usage or I/O
    error, 70 an internal error (a bug in dyndq: among them a file made that fails its check or
    does not load on its engine, the input passing: told with the checker's or engine's words),
    130 interrupted.

A command that wants other words for an error than the table's (naming a flag, an engine)
raises `UsageError` (2) or `ProblemsFound` (1) with them.
"""
from __future__ import annotations

import os
import sys

from dyndq.wording import first_line, problem_list

OK, PROBLEMS, USAGE = 0, 1, 2
INTERNAL = 70  # sysexits.h EX_SOFTWARE: a bug in dyndq, not in the model or the command line
INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


class UsageError(Exception):
    """A mistake in how the command was called, or a file it cannot use (exit 2)."""


class ProblemsFound(Exception):
    """Problems found in the model, or an engine that cannot build or run it (exit 1); the
    message says which."""


def err(message: str) -> None:
    """One message of the command line on stderr, "dyndq: " first."""
    print(f"dyndq: {message}", file=sys.stderr)


# -- how each error is told: (error, subject) -> the text for stderr, or None (not ours to tell) --

def _said(e, subject):
    return f"dyndq: {e}"


def _problems(e, subject):  # "MODEL: N problems" and one line each; a command about no model has none
    return None if subject is None else problem_list(subject, e.problems)


def _feeds(e, subject):  # feeds that do not fit the graph's inputs: each input named
    if len(e.problems) == 1:
        return f"dyndq: {subject}: input {e.problems[0]}"
    return "dyndq: " + problem_list(f"{subject}: the inputs", e.problems, item="input ")


def _options(e, subject):  # a bad option value of quantize: each named by its flag
    return "\n".join(f"dyndq: --{p.argument.replace('_', '-')}: found {p.found}; allowed: {p.allowed}"
                     for p in e.problems)


def _nothing_to_quantize(e, subject):
    return "\n".join([f"{subject}: nothing to quantize (nothing written): {e.because('--exclude')}"] + [f"  - {p}" for p in e.problems])


def _written_file_bug(e, subject):  # the file made fails its check: nothing put in place, the check's own words
    return f"dyndq: {e}\n(a bug in dyndq: the input passes the same check; please report it)"


def _interrupted(e, subject):
    return "dyndq: interrupted"


def table() -> tuple:
    """(error class, exit code, how it is told), the first entry whose class the error is an
    instance of deciding; a subclass comes before its base. Any other Exception is an internal
    error (70)."""
    from dyndq import ValidationError
    from dyndq.atomic_writes import ModelFileError
    from dyndq.quantization import NothingToQuantize, OptionError
    from dyndq.runner import FeedError
    from dyndq.written import InheritedProblem, WrittenFileError

    return (
        (UsageError, USAGE, _said),
        (ModelFileError, USAGE, _said),  # a missing, unreadable or unwritable file
        (FeedError, USAGE, _feeds),
        (OptionError, USAGE, _options),
        (NothingToQuantize, PROBLEMS, _nothing_to_quantize),
        (ValidationError, PROBLEMS, _problems),
        (ProblemsFound, PROBLEMS, _said),
        (InheritedProblem, PROBLEMS, _said),  # (the file made fails as the input does: the model's problem)
        (WrittenFileError, INTERNAL, _written_file_bug),
        (KeyboardInterrupt, INTERRUPTED, _interrupted),
    )


def tell(e: BaseException, subject: str | None = None) -> int:
    """Print what `e` (raised by a command about the file `subject`) means on stderr and return
    its exit code: the one mapping from errors to exit codes."""
    for cls, code, told in table():
        if isinstance(e, cls):
            text = told(e, subject)
            if text is not None:
                print(text, file=sys.stderr)
                return code
            break
    return _internal(e)


def _internal(e: BaseException) -> int:
    """A bug of ours: its own exit code, never 1 ("problems found"); one line, no traceback
    unless DYNDQ_TRACEBACK is set."""
    import traceback

    if os.environ.get("DYNDQ_TRACEBACK"):
        traceback.print_exc()
    where = traceback.extract_tb(e.__traceback__)[-1]
    err(f"internal error: {type(e).__name__}: {first_line(e)} (at {os.path.basename(where.filename)}:{where.lineno}; "
        f"set DYNDQ_TRACEBACK=1 for the traceback, and please report it)")
    return INTERNAL
