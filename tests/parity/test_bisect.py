"""bisect.culprits: the switches responsible, by halves, on made-up engines whose outcome is known."""
from __future__ import annotations

import math

from hypothesis import given, strategies as st

from dyndq.parity.bisect import culprits


def engine(responsible):
    """Agrees once every responsible switch is off (each one moves the result on its own)."""
    return lambda off: set(responsible) <= set(off)


@given(st.integers(1, 80).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_one_culprit_among_n_is_found_in_about_log2_n_sessions(case):
    n, k = case
    names = [f"T{i}" for i in range(n)]
    found, runs = culprits(names, engine([names[k]]))
    assert found == [names[k]]
    assert runs <= math.ceil(math.log2(n)) + 2  # all off, the halves, the check of the answer


@given(st.integers(2, 40).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=4))))
def test_several_culprits_are_all_found_and_nothing_else(case):
    n, picked = case
    names = [f"T{i}" for i in range(n)]
    responsible = [names[i] for i in sorted(picked)]
    found, runs = culprits(names, engine(responsible))
    assert found == responsible


def test_culprits_that_matter_only_together_give_a_smallest_set():
    """Agrees when either A or B is off (the difference needs both): turning off one of them is enough."""
    names = ["x", "A", "y", "B", "z"]
    found, _ = culprits(names, lambda off: "A" in off or "B" in off)
    assert found in (["A"], ["B"])


def test_a_difference_no_switch_explains_is_said_so():
    found, runs = culprits(["A", "B", "C"], lambda off: False)
    assert found is None and runs == 1
