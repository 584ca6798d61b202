"""Every row of the shared table (tests/cases/table.py), for every registered op version, through every
layer: `opcheck` is the one runner of the table's rows (what it checks: its docstring)."""
import pytest
from cases import ALL_CASES, ALL_INVALID, ALL_VALID, ids, opcheck, opcheck_invalid

import dyndq
from dyndq.opdefs import versions_of


def test_every_registered_version_has_rows():
    versions = {c.version for c in ALL_CASES}
    assert versions == set(versions_of(dyndq.DOMAIN, "DynamicDequantize"))
    assert len(set(ids(ALL_CASES))) == len(ALL_CASES)  # each row named once


@pytest.mark.parametrize("case", ALL_VALID, ids=ids(ALL_VALID))
def test_opcheck(case):
    opcheck(case)


def test_every_invalid_row_is_refused_naming_its_arguments():
    """Each invalid row (version 1's and version 2's) through `opcheck_invalid`: check, the
    shape function, the kernel (with and without out), onnx.checker."""
    for case in ALL_INVALID:
        opcheck_invalid(case)
