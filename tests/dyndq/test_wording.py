"""The message helpers of dyndq.wording."""
from dyndq.wording import cut


def test_cut_keeps_short_names_whole_and_cuts_long_ones_saying_their_length():
    assert cut("fc_gate") == "fc_gate" and cut("x" * 80) == "x" * 80
    long = "a" * 1000 + "END"
    shown = cut(long)
    assert len(shown) < 100 and shown.startswith("aaaa") and "END (1,003 characters)" in shown
    assert cut(12345) == "12345" and len(cut("b" * 500, limit=200)) < 250
