"""Which of a list of switches makes an engine's result differ: found by running again with
switches turned off (ONNX Runtime's transformers disabled, OpenVINO's settings set to their
exact values), by halves.

`agrees(off)` runs the engine with the switches `off` turned off and says whether every output
then agrees with the reference.  With one switch responsible among n, the search costs about
log2(n) + 2 runs: it first trusts that the culprit lies in the half whose turning off does not
make it agree, then checks the answer once; when that check fails (switches that matter only
together, or each on its own), it searches both halves (ddmin's way, Zeller 2002), which costs more.
"""
from __future__ import annotations

from typing import Callable, Sequence


class Searcher:
    """`agrees` remembered per set of switches turned off, and counted (each call is an engine session)."""

    def __init__(self, agrees: Callable[[tuple[str, ...]], bool]):
        self._agrees = agrees
        self._seen: dict[frozenset, bool] = {}
        self.runs = 0

    def agrees(self, off: Sequence[str]) -> bool:
        key = frozenset(off)
        if key not in self._seen:
            self.runs += 1
            self._seen[key] = self._agrees(tuple(off))
        return self._seen[key]


def culprits(switches: Sequence[str], agrees: Callable[[tuple[str, ...]], bool]) -> tuple[list[str] | None, int]:
    """A smallest set of `switches` whose turning off makes it agree (in the switches' order), and the
    runs it took; None when turning them all off does not (the cause is none of them)."""
    search = Searcher(agrees)
    switches = list(switches)
    if not search.agrees(switches):
        return None, search.runs
    guess = _one(switches, search)
    if guess is not None and search.agrees(guess):
        return guess, search.runs
    found = _minimal(switches, [], search)
    return [s for s in switches if s in found], search.runs


def _one(switches: list[str], search: Searcher) -> list[str] | None:
    """The single culprit, assuming there is one: the half whose turning off makes it agree, else the other."""
    while len(switches) > 1:
        half = len(switches) // 2
        first, second = switches[:half], switches[half:]
        switches = first if search.agrees(first) else second
    return switches or None


def _minimal(candidates: list[str], fixed: list[str], search: Searcher) -> list[str]:
    """A smallest part of `candidates` that, turned off with `fixed`, makes it agree (given that all of
    them with `fixed` do)."""
    if search.agrees(fixed):
        return []
    if len(candidates) == 1:
        return candidates
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    if search.agrees(fixed + first):
        return _minimal(first, fixed, search)
    if search.agrees(fixed + second):
        return _minimal(second, fixed, search)
    in_first = _minimal(first, fixed + second, search)
    return in_first + _minimal(second, fixed + in_first, search)
