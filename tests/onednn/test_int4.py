"""dyndq/onednn/int4.py: oneDNN's int4 memory, two values a byte by physical offset, read and written in logical order."""
import ml_dtypes
import numpy as np
import pytest

from dyndq import onednn


def test_int4_packing_follows_physical_offsets():
    a = np.arange(-8, 8).reshape(4, 4).astype(ml_dtypes.int4)
    dense = onednn.pack_int4(a)
    assert dense[0] == ((-7 & 15) << 4 | (-8 & 15)) and len(dense) == 8
    # transposed layout: element [i, j] at offset i + 4 j
    packed = onednn.pack_int4(a, strides=[1, 4])
    assert packed[0] == ((int(a[1, 0]) & 15) << 4 | (int(a[0, 0]) & 15))
    assert np.array_equal(onednn.unpack_int4(packed, (4, 4), [1, 4], signed=True), a)
    u = np.arange(15).reshape(3, 5).astype(ml_dtypes.uint4)
    assert np.array_equal(onednn.unpack_int4(onednn.pack_int4(u), (3, 5), None, signed=False), u)
    with pytest.raises(ValueError):
        onednn.unpack_int4(b"\x00", (4, 4), [1, 4], signed=True)
