"""Every row of the shared table, for every registered op version, through every layer (`opcheck`)."""
import pytest
from cases import ALL_CASES, ids, opcheck

import dyndq
from dyndq.opdefs import versions_of


def test_every_registered_version_has_rows():
    versions = {c.version for c in ALL_CASES}
    assert versions == set(versions_of(dyndq.DOMAIN, "DynamicDequantize"))


@pytest.mark.parametrize("case", ALL_CASES, ids=ids(ALL_CASES))
def test_opcheck(case):
    opcheck(case)
