"""The kernel's version-2 forms (int4/uint4, float16/bfloat16, per_group) against cases.oracle_2,
bit for bit (NaN payloads and -0 included), over dtypes, shapes, qtypes, layouts, block
boundaries, out= and threads; and its bad-input errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dyndq
from dyndq import DYNAMIC_DEQUANTIZE_2, TensorSpec
from dyndq.kernels.parallel import tuned

# every test here runs on the compiled kernel and on the NumPy one (conftest.py)
pytestmark = pytest.mark.usefixtures("kernel_path")

from cases import budget, oracle_2, same_bits

dynamic_dequantize = dyndq.dynamic_dequantize

T1 = ["int8", "uint8", "int4", "uint4"]
T2 = ["float32", "float16", "bfloat16"]
T3 = [None, "int8", "uint8", "int32", "int4", "uint4"]
RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15), "int32": (-(2**31), 2**31 - 1)}
BITS = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def dt(name):
    return np.dtype(name)


def all_values(name) -> np.ndarray:
    lo, hi = RANGE[name]
    return np.arange(lo, hi + 1, dtype=np.int64).astype(dt(name))


def special_scales(t2) -> np.ndarray:
    """-0, NaNs with payloads, infinities, the largest finite, the smallest subnormal, values
    whose products overflow float16 or land among subnormals, and ties of the rounding."""
    f = ml_dtypes.finfo(dt(t2))
    values = [0.0, -0.0, np.inf, -np.inf, float(f.max), -float(f.max), float(f.smallest_subnormal),
              -float(f.smallest_subnormal), float(f.smallest_normal), 1.0, -2.5, 0.1, 65504 / 7, 65504 / 300, 3e-8,
              1 + float(f.eps), 1 - float(f.epsneg)]
    a = np.array(values, np.float64).astype(dt(t2))
    nan_bits = {"float32": [0x7FC12345, 0xFFA00001, 0x7F800001], "float16": [0x7E01, 0xFC01, 0x7C01],
                "bfloat16": [0x7FC1, 0xFF81, 0x7F81]}[t2]
    return np.concatenate([a, np.array(nan_bits, BITS[t2]).view(dt(t2))])


def kernel_agrees(src, scales, zps=None, **attrs):
    full = {"qtype": "per_tensor", "axis": 1, "group_shape": None, **attrs}
    got = dynamic_dequantize(src, scales, zps, **attrs)
    expect = oracle_2(src, scales, zps, full["qtype"], full["axis"], full["group_shape"])
    assert got.dtype == np.dtype(np.asarray(scales).dtype.name)
    assert same_bits(got, expect), (got, expect)
    return got


# -- exactness at the edges, every dtype combination ------------------------------------------------


@pytest.mark.parametrize("t2", T2)
@pytest.mark.parametrize("t1", T1)
def test_every_src_value_times_special_scales(t1, t2):
    """Every src value times every special scale, per channel, per group and per tensor, with no
    zero point and with zero points of each T3 at its ends, 0 and 1."""
    src = all_values(t1)
    scales = special_scales(t2)
    grid = np.tile(src[:, None], (1, scales.size))  # every value on every special scale's channel
    for t3 in T3:
        zp_values = [0] if t3 is None else sorted({RANGE[t3][0], RANGE[t3][1], 0, 1})
        for zp in zp_values:
            zps = None if t3 is None else np.full(scales.size, zp, dt(t3))
            kernel_agrees(grid, scales, zps, qtype="per_channel", axis=1)
            kernel_agrees(grid, scales.reshape(1, -1), None if zps is None else zps.reshape(1, -1),
                          qtype="per_group", group_shape=[grid.shape[0], 1])
            for s in scales[:6]:
                kernel_agrees(src, np.array([s], dt(t2)), None if zps is None else zps[:1])


def test_float16_overflow_and_subnormal_results():
    src = np.array([7, -8, 1, 3, 0], ml_dtypes.int4)
    got = kernel_agrees(src, np.array([10000.0], np.float16))
    assert np.isinf(got[:2]).all() and got[0] > 0 and got[1] < 0
    tiny = np.array([2.0**-24], np.float16)  # the smallest float16 subnormal
    got = kernel_agrees(src, tiny)
    assert got.view(np.uint16).tolist() == [7, 0x8008, 1, 3, 0]
    got = kernel_agrees(np.array([3, -3], np.int8), np.array([-0.0], np.float16))
    assert got.view(np.uint16).tolist() == [0x8000, 0x0000]


def test_bfloat16_subnormal_results_are_kept():
    sub = np.array([2.0**-133], ml_dtypes.bfloat16)  # a bfloat16 subnormal (oneDNN would flush it)
    got = kernel_agrees(np.array([1, 2, -1, 0], np.int8), sub)
    assert (got.astype(np.float32) != 0).sum() == 3


def test_int4_bytes_with_high_bits_read_their_low_nibble():
    raw = np.arange(256, dtype=np.uint8)
    for name in ("int4", "uint4"):
        src = raw.view(dt(name))
        got = kernel_agrees(src, np.array([1.0], np.float32))
        assert np.array_equal(got, src.astype(np.int64).astype(np.float32))
    kernel_agrees(raw.view(dt("uint4")).reshape(16, 16), np.ones((4, 1), np.float16),
                  raw[:4].view(dt("int4")).reshape(4, 1), qtype="per_group", group_shape=[4, 16])


@pytest.mark.parametrize("t2", T2)
def test_large_int32_zero_points_round_once(t2):
    """int32 zero points past float32's exact integers (2**24 + 1), at int32's ends and 2**23."""
    src = all_values("int4").reshape(4, 4)
    for zp in (2**24 + 1, -(2**31), 2**31 - 1, 2**23, -(2**23) - 1):
        zps = np.full((2, 1), zp, np.int32)
        kernel_agrees(src, np.ones((2, 1), dt(t2)), zps, qtype="per_group", group_shape=[2, 4])


# -- per_group shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,groups", [
    ((8, 64), [1, 32]), ((64, 8), [32, 1]), ((4, 8, 6), [2, 4, 3]), ((2, 3, 4, 5, 6), [1, 3, 2, 5, 1]),
    ((6,), [3]), ((6,), [6]), ((0, 4), [1, 2]), ((4, 0), [2, 1]), ((5, 7), [5, 7]), ((3, 32, 256), [1, 1, 128]),
])
def test_per_group_shapes(shape, groups):
    """Each shape with four dtype combinations (uint4/float16/uint8, int4/bfloat16/none,
    int8/float32/int4, uint8/float16/int32), on default blocks and on tiny blocks over two threads."""
    for t1, t2, t3 in (("uint4", "float16", "uint8"), ("int4", "bfloat16", None), ("int8", "float32", "int4"),
                       ("uint8", "float16", "int32")):
        rng = np.random.default_rng(len(shape))
        lo, hi = RANGE[t1]
        src = rng.integers(lo, hi + 1, shape).astype(dt(t1))
        pshape = tuple(d // g for d, g in zip(shape, groups))
        scales = rng.standard_normal(pshape).astype(dt(t2))
        zps = None if t3 is None else rng.integers(*RANGE[t3], pshape, endpoint=True).astype(dt(t3))
        kernel_agrees(src, scales, zps, qtype="per_group", group_shape=groups)
        with tuned(chunk=5, narrow_chunk=3, parallel_min=0, cores=2):
            kernel_agrees(src, scales, zps, qtype="per_group", group_shape=groups, threads=2)


def test_large_tensor_on_two_threads_default_blocks():
    rng = np.random.default_rng(9)
    src = rng.integers(0, 16, (64, 4096 + 128)).astype(dt("uint4"))
    scales = rng.standard_normal((64, 33)).astype(np.float16)
    zps = rng.integers(0, 256, (64, 33)).astype(np.uint8)
    with tuned(cores=2):
        for threads in (None, 1, 2):
            kernel_agrees(src, scales, zps, qtype="per_group", group_shape=[1, 128], threads=threads)
            kernel_agrees(src.T, scales.T.astype(ml_dtypes.bfloat16), zps.T, qtype="per_group",
                          group_shape=[128, 1], threads=threads)


# -- property-based: everything against the oracle -------------------------------------------------------


def _ints(name, shape):
    lo, hi = RANGE[name]
    edge = st.sampled_from([lo, hi, 0, min(hi, 1), max(lo, -1)])
    return hnp.arrays(np.int64, shape, elements=st.one_of(st.integers(lo, hi), edge)).map(lambda a: a.astype(dt(name)))


def _floats(t2, shape):
    width = BITS[t2]
    raw = st.integers(0, np.iinfo(width).max)
    nice = st.floats(-1000, 1000, width=32).map(lambda x: int(np.array(x, np.float32).astype(dt(t2)).view(width)))
    special = st.sampled_from([int(b) for b in special_scales(t2).view(width)])
    return hnp.arrays(width, shape, elements=st.one_of(raw, nice, special)).map(lambda a: a.view(dt(t2)))


@st.composite
def problems(draw):
    t1, t2, t3 = draw(st.sampled_from(T1)), draw(st.sampled_from(T2)), draw(st.sampled_from(T3))
    qtype = draw(st.sampled_from(["per_tensor", "per_channel", "per_group"]))
    rank = draw(st.integers(1, 5))
    side = 6 if rank <= 3 else 3
    axis, groups = 1, None
    if qtype == "per_group":
        groups = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
        counts = draw(st.lists(st.integers(0 if draw(st.booleans()) else 1, 3), min_size=rank, max_size=rank))
        shape = tuple(c * g for c, g in zip(counts, groups))
        pshape = tuple(counts)
        zshape = pshape
    else:
        shape = tuple(draw(st.lists(st.integers(0, side), min_size=rank, max_size=rank)))
        if draw(st.booleans()):
            shape = tuple(d or 1 for d in shape)  # mostly non-empty
        if qtype == "per_channel":
            axis = draw(st.integers(-rank, rank - 1))
            pshape = (shape[axis],)
            zshape = draw(st.sampled_from([pshape, (1,)]))
        else:
            pshape = draw(st.sampled_from([(1,), ()]))
            zshape = draw(st.sampled_from([(1,), ()]))
    src = draw(_ints(t1, shape))
    scales = draw(_floats(t2, pshape))
    zps = None if t3 is None else draw(_ints(t3, zshape))
    layout = draw(st.sampled_from(["c", "f", "reversed", "strided", "readonly"]))
    if layout == "f":
        src = np.asfortranarray(src)
    elif layout == "reversed":
        src = np.ascontiguousarray(src[::-1])[::-1]
    elif layout == "strided":
        src = np.repeat(src, 2, axis=-1)[..., ::2]
    elif layout == "readonly":
        src.flags.writeable = False
    if scales.ndim and draw(st.booleans()):
        scales = np.ascontiguousarray(scales[::-1])[::-1]
    if t2 != "bfloat16" and draw(st.booleans()):  # (bfloat16 has no byte-swapped dtype)
        scales = scales.astype(scales.dtype.newbyteorder(">"))
    if t3 == "int32" and draw(st.booleans()):
        zps = zps.astype(">i4")
    out = draw(st.sampled_from([None, "c", "strided", "swapped"]))
    knobs = draw(st.sampled_from([None, 1, 2, 5, 16, 64]))
    threads = draw(st.sampled_from([None, 1, 2]))
    return src, scales, zps, dict(qtype=qtype, axis=axis, group_shape=groups), out, knobs, threads


def test_property_matches_oracle_2_bitwise(kernel_path):
    """Everything against the oracle; the full budget on the path that serves (cases.budget)."""

    @settings(max_examples=budget(kernel_path, 500), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(problems())
    def check(problem):
        src, scales, zps, attrs, use_out, knobs, threads = problem
        copies = [None if a is None else a.copy() for a in (src, scales, zps)]
        expect = oracle_2(src, scales, zps, attrs["qtype"], attrs["axis"], attrs["group_shape"])
        t2 = np.dtype(scales.dtype.name)
        expect = expect.astype(t2)  # (the oracle keeps byte-swapped scales' byte order)
        out = None
        if use_out == "c":
            out = np.empty(src.shape, t2)
        elif use_out == "strided":
            out = np.empty(src.shape[:-1] + (src.shape[-1] * 2,), t2)[..., ::2]
        elif use_out == "swapped" and t2.name != "bfloat16":
            out = np.empty(src.shape, t2.newbyteorder(">"))
        kwargs = {k: v for k, v in attrs.items() if v is not None}
        if knobs is None:
            got = dynamic_dequantize(src, scales, zps, out=out, threads=threads, **kwargs)
        else:
            with tuned(chunk=knobs, narrow_chunk=knobs, parallel_min=0, small=0, cores=2):
                got = dynamic_dequantize(src, scales, zps, out=out, threads=threads, **kwargs)
        if out is not None:
            assert got is out
            got = got.astype(t2)
        assert same_bits(got, expect)
        spec = DYNAMIC_DEQUANTIZE_2.shape_inference(
            TensorSpec.of(src), TensorSpec.of(scales), None if zps is None else TensorSpec.of(zps), **kwargs)
        assert spec == TensorSpec(t2.name, src.shape)
        for a, b in zip(copies, (src, scales, zps)):
            assert a is None or (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())

    check()


# (bad input: tests/kernels/test_arguments.py)


def test_zero_d_and_numpy_scalar_int4():
    got = kernel_agrees(np.array(-3, dt("int4")), np.array([0.5], np.float16), np.array(2, dt("uint4")))
    assert got.shape == () and float(got) == -2.5
    got = kernel_agrees(ml_dtypes.int4(-3), np.float16(0.5))
    assert got.shape == () and float(got) == -1.5


@pytest.mark.parametrize("t1", T1)
def test_float16_fast_range_every_value(t1):
    """Scales whose products are all 0 or normal float16s take the float16 rounding without its
    clamps; at the edges of that range (2**-14, and the largest scale that cannot overflow) too;
    with no zero point and with one of each T3."""
    for t3 in [None, "int8", "uint8", "int4", "uint4", "int32"]:
        _float16_fast_range_every_value(t1, t3)


def _float16_fast_range_every_value(t1, t3):
    from dyndq.kernels import numpy_kernel

    rng = np.random.default_rng(5)
    src = all_values(t1)
    zp = 0 if t3 is None else int(rng.integers(*RANGE[t3 if t3 != "int32" else "int8"], endpoint=True))
    lo, hi = RANGE[t1]
    d_max = max(abs(lo - zp), abs(hi - zp))
    top = np.float16(65504 / d_max)
    if float(top) * d_max > 65504:
        top = np.nextafter(top, np.float16(0))
    mags = np.clip(np.exp2(rng.uniform(-14, np.log2(float(top)), 57)).astype(np.float16), np.float16(2.0**-14), top)
    edges = np.array([2.0**-14, -(2.0**-14), float(top), -float(top), 0.0, -0.0, 1.0], np.float16)
    scales = np.concatenate([edges, mags * rng.choice([-1, 1], 57).astype(np.float16)])
    z = None if t3 is None else np.full(scales.size, zp, dt(t3))
    assert numpy_kernel._products_normal_or_zero(dt(t1), scales.astype(np.float32), None if z is None else z.astype(np.float32))
    grid = np.tile(src[:, None], (1, scales.size))
    kernel_agrees(grid, scales, z, qtype="per_channel", axis=1)
    with tuned(narrow_chunk=7, parallel_min=0, cores=2):
        kernel_agrees(grid, scales, z, qtype="per_channel", axis=1, threads=2)


def test_rows_longer_than_a_block_with_a_16_bit_output():
    """Short rows sharing their parameters run as whole rows (the NumPy kernel's tiled runs), each
    more elements than a block where a row is longer than `narrow_chunk`: the scratch holds them."""
    src = np.arange(-32, 32, dtype=np.int8).reshape(4, 16)
    scales = np.linspace(-2, 2, 16).astype(np.float16)
    with tuned(chunk=3, narrow_chunk=3, small=0, parallel_min=0, cores=2):
        kernel_agrees(src, scales, qtype="per_channel", axis=-1)
        kernel_agrees(src, scales.astype(ml_dtypes.bfloat16), np.full(16, 3, np.uint8), qtype="per_channel", axis=1)
