"""kernels/narrowing.py, the NumPy rounding of float32 products to float16 (the NumPy kernel's; the
compiled kernel's own roundings are tested in test_native.py): NumPy's bits on every rounding
boundary.  It does not depend on the kernel's path, so these run once."""
from __future__ import annotations

import numpy as np

from cases import same_bits
from dyndq.kernels import narrowing


def test_to_float16_matches_numpy_on_every_rounding_boundary():
    """Every exponent and sign, every float16 mantissa, the 13 dropped bits at and around a tie."""
    exps = np.arange(256, dtype=np.uint32) << 23
    mant = np.arange(1024, dtype=np.uint32) << 13
    low = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], np.uint32)
    bits = (exps[:, None, None] | mant[None, :, None] | low[None, None, :]).reshape(-1)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    bits = np.concatenate([bits, np.random.default_rng(0).integers(0, 2**32, 1 << 18, dtype=np.uint32)])
    p = bits.view(np.float32)
    with np.errstate(all="ignore"):
        want = p.astype(np.float16)
    want.view(np.uint16)[np.isnan(p)] = 0x7E00  # NaNs: the one quiet NaN
    out = np.empty(p.size, np.float16)
    narrowing.to_float16(p.copy(), out, np.empty(2 * p.size, np.uint32))
    assert same_bits(out, want)


def test_float16_rounding_without_clamps_matches_numpy():
    exps = np.arange(256, dtype=np.uint32) << 23
    mant = np.arange(0, 1 << 23, 997, dtype=np.uint32)
    bits = (exps[:, None] | mant[None, :]).reshape(-1)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000), np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 1], np.uint32)])
    p = bits.view(np.float32)
    p = p[~np.isnan(p)]
    with np.errstate(all="ignore"):
        a = np.abs(p)
        q = p[((a >= 2.0**-14) & (a <= 65504)) | (a == 0)]
        h = np.empty(q.size, np.float16)
        narrowing.to_float16(q.copy(), h, np.empty(2 * q.size, np.uint32), may_hold_nan=False, normal_or_zero=True)
        assert same_bits(h, q.astype(np.float16))
