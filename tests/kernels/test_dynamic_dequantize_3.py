"""Version 3's kernel on each of its paths (tests/kernels/conftest.py: the compiled kernel at each
CPU level, and NumPy): every code of every type, with each scale and output dtype, every form and
zero point, against the oracle, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cases import oracle_3, same_bits

import dyndq
from dyndq.opdefs import FLOAT_CODES_3, INTEGER_CODES_3, dtypes

pytestmark = [pytest.mark.usefixtures("kernel_path"), pytest.mark.filterwarnings("ignore::RuntimeWarning")]

CODES = INTEGER_CODES_3 + FLOAT_CODES_3
SCALES = ("float32", "float16", "bfloat16", "float8_e8m0fnu")
OUTS = {"float32": 1, "float16": 10, "bfloat16": 16}


def codes_of(dtype: str, n: int, rng) -> np.ndarray:
    """n codes holding every bit pattern of a type of up to 8 bits (tiled), random ones of wider types
    with their extremes."""
    row = dtypes.by_name(dtype)
    if row.bits <= 8:
        return np.resize(rng.permutation(np.arange(1 << row.bits, dtype=np.uint8)), n).view(row.numpy)
    lo, hi = dtypes.integer_range(dtype)
    x = rng.integers(lo, hi, n, endpoint=True).astype(row.numpy)
    x[: min(n, 2)] = [lo, hi][: min(n, 2)]
    return x


def scales_of(dtype: str, shape, rng) -> np.ndarray:
    if dtype == "float8_e8m0fnu":  # every exponent, 2**-127 (a float32 subnormal) and NaN (0xFF) included
        return np.resize(rng.permutation(np.arange(256, dtype=np.uint8)), shape).view(dtypes.by_name(dtype).numpy)
    s = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    flat = s.reshape(-1)
    if flat.size >= 6:  # an infinity, a zero and a NaN among them
        flat[rng.choice(flat.size, 3, replace=False)] = [np.inf, 0.0, np.nan]
    return s.astype(dtypes.by_name(dtype).numpy)


def signed_zeros(dtype, shape, rng, negative: float) -> np.ndarray:
    """Zero points of a float code type holding zeros, each -0 with probability `negative` (the
    fnuz types have no -0: theirs are +0)."""
    signs = rng.random(shape) < negative
    return np.where(signs, np.float32(-0.0), np.float32(0.0)).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("scale_dtype", SCALES)
@pytest.mark.parametrize("code", CODES)
def test_every_code_with_every_scale_and_output_dtype_in_every_form(code, scale_dtype):
    rng = np.random.default_rng(sum(map(ord, code + scale_dtype)))
    x = codes_of(code, 3 * 320, rng).reshape(3, 320)
    forms = [("per_tensor", {}, (1,)), ("per_channel", {"axis": 0}, (3,)),
             ("per_group", {"group_shape": (1, 32)}, (3, 10))]
    for qtype, extra, shape in forms:
        s = scales_of(scale_dtype, shape, rng)
        zps = [None]
        if code in INTEGER_CODES_3:
            lo, hi = dtypes.integer_range(code)
            zps += [rng.integers(lo, hi, shape, endpoint=True).astype(x.dtype),
                    rng.integers(-2**31, 2**31 - 1, shape, endpoint=True).astype(np.int32)]
        else:  # zeros: +0, -0, and both
            zps += [signed_zeros(x.dtype, shape, rng, sign) for sign in (0.0, 1.0, 0.5)]
        for zp in zps:
            for out_name, out in OUTS.items():
                if scale_dtype != "float8_e8m0fnu" and out_name == scale_dtype:
                    out = None  # the default: the scales' own dtype
                got = dyndq.dynamic_dequantize(x, s, zp, qtype=qtype, output_dtype=out, **extra)
                want = oracle_3(x, s, zp, qtype, extra.get("axis", 1), extra.get("group_shape"), out)
                assert same_bits(got, want), (qtype, out_name, None if zp is None else zp.dtype.name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CODES), st.sampled_from(SCALES), st.sampled_from(list(OUTS)),
       st.integers(1, 5), st.integers(1, 70_000), st.sampled_from([None, 1, 2]), st.integers(0, 2**32 - 1))
def test_sizes_tails_and_threads(code, scale_dtype, out_name, groups, per_group, threads, seed):
    """Runs of every length (a vector's tail), blocks shared among threads, per group along the last axis."""
    rng = np.random.default_rng(seed)
    n = groups * per_group
    x = codes_of(code, n, rng).reshape(1, n)
    s = scales_of(scale_dtype, (1, groups), rng)
    zp = None
    if code in INTEGER_CODES_3 and rng.random() < 0.5:
        lo, hi = dtypes.integer_range(code)
        zp = rng.integers(lo, hi, (1, groups), endpoint=True).astype(x.dtype)
    got = dyndq.dynamic_dequantize(x, s, zp, qtype="per_group", group_shape=(1, per_group), output_dtype=OUTS[out_name],
                                   threads=threads)
    assert same_bits(got, oracle_3(x, s, zp, "per_group", 1, (1, per_group), OUTS[out_name]))


def test_out_takes_the_output_dtype_not_the_scales():
    x = codes_of("float4_e2m1fn", 64, np.random.default_rng(0))
    s = np.array([127], np.uint8).view(dtypes.by_name("float8_e8m0fnu").numpy)
    out = np.empty(64, dtypes.by_name("bfloat16").numpy)
    assert dyndq.dynamic_dequantize(x, s, output_dtype=16, out=out) is out
    assert same_bits(out, oracle_3(x, s, None, output_dtype=16))
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.dynamic_dequantize(x, s, output_dtype=16, out=np.empty(64, np.float32))
    assert [p.argument for p in e.value.problems] == ["out"] and "bfloat16" in str(e.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([c for c in FLOAT_CODES_3 if "fnuz" not in c]), st.sampled_from(SCALES),
       st.sampled_from(list(OUTS)), st.sampled_from(["per_tensor", "per_channel", "per_group"]),
       st.integers(1, 5), st.integers(1, 5_000), st.floats(0, 1), st.sampled_from([None, 2]),
       st.integers(0, 2**32 - 1))
def test_float_codes_with_zero_points_of_either_sign(code, scale_dtype, out_name, qtype, groups, per_group,
                                                     negative, threads, seed):
    """Zeros of either sign as zero points of float codes: DequantizeLinear's (x - x_zero_point) *
    x_scale in IEEE arithmetic, so a -0 code minus a -0 zero point is +0 (and minus +0 stays -0),
    every other code its own value; over runs of every length, forms and threads."""
    rng = np.random.default_rng(seed)
    x = codes_of(code, 2 * groups * per_group, rng).reshape(2, groups * per_group)
    shape, extra = {"per_tensor": ((1,), {}), "per_channel": ((2,), {"axis": 0}),
                    "per_group": ((2, groups), {"group_shape": (1, per_group)})}[qtype]
    s = scales_of(scale_dtype, shape, rng)
    zp = signed_zeros(x.dtype, shape, rng, negative)
    got = dyndq.dynamic_dequantize(x, s, zp, qtype=qtype, output_dtype=OUTS[out_name], threads=threads, **extra)
    assert same_bits(got, oracle_3(x, s, zp, qtype, extra.get("axis", 1), extra.get("group_shape"), OUTS[out_name]))


@pytest.mark.parametrize("code", [c for c in FLOAT_CODES_3 if "fnuz" not in c])
def test_a_minus_zero_code_minus_a_minus_zero_zero_point_is_plus_zero(code):
    """The four signs of a zero code and a zero zero point, by a scale of each sign: the bits
    IEEE subtraction then multiplication give (-0 - (-0) = +0, -0 - (+0) = -0)."""
    dtype = dtypes.by_name(code).numpy
    zero, minus_zero = (np.array([v], np.float32).astype(dtype) for v in (0.0, -0.0))
    for x, zp, scale, want in [(minus_zero, minus_zero, 1.0, 0.0), (minus_zero, zero, 1.0, -0.0),
                               (zero, minus_zero, 1.0, 0.0), (minus_zero, minus_zero, -2.0, -0.0),
                               (minus_zero, zero, -2.0, 0.0)]:
        got = dyndq.dynamic_dequantize(x, np.array([scale], np.float32), zp)
        assert same_bits(got, np.array([want], np.float32)), (x.view(np.uint8), zp.view(np.uint8), scale)


def test_float_codes_take_zero_points_of_zero_only():
    x = codes_of("float8_e4m3fn", 8, np.random.default_rng(0))
    zp = np.zeros(1, x.dtype)
    assert same_bits(dyndq.dynamic_dequantize(x, np.ones(1, np.float32), zp),
                     dyndq.dynamic_dequantize(x, np.ones(1, np.float32)))
    for bad in (np.ones(1, x.dtype), np.full(1, np.nan, np.float32).astype(x.dtype)):
        with pytest.raises(dyndq.ValidationError) as e:
            dyndq.dynamic_dequantize(x, np.ones(1, np.float32), bad)
        assert [p.argument for p in e.value.problems] == ["zps"] and "nonzero" in str(e.value)
