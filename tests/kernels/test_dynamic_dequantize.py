"""The kernel of DynamicDequantize-1 on every path (compiled at each level, NumPy), against an
oracle written plainly (cases.oracle): (int64(src) - int64(zp)).astype(float32) * scales,
broadcast along the axis.  Results are compared bit for bit (NaN payloads, -0 included).
Arguments are judged before a path is chosen: their tests are in test_arguments.py; every row
of the shared table goes through every layer once, in tests/test_opcheck.py."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dyndq
from dyndq import DYNAMIC_DEQUANTIZE_1, TensorSpec

# This module judges version 1's kernel by version 1's rules; the public kernel
# (dyndq.dynamic_dequantize, version 2) must give the same bits for every valid row.
dynamic_dequantize = DYNAMIC_DEQUANTIZE_1.kernel
from dyndq.kernels import parallel
from dyndq.kernels.parallel import TUNING, tuned

# every test here runs on the compiled kernel and on the NumPy one (conftest.py)
pytestmark = pytest.mark.usefixtures("kernel_path")

from cases import budget, oracle, same_bits


# -- the oracle ------------------------------------------------------------------------------


@contextmanager
def tiny_blocks(chunk, parallel_min=0):
    """Cut even small arrays into many blocks, shared among threads: every path's block and
    thread boundaries get exercised on arrays of a few elements."""
    with tuned(chunk=chunk, parallel_min=parallel_min, small=0, cores=2):
        yield


f32 = np.float32
u8 = np.uint8
i8 = np.int8
i32 = np.int32


# -- the golden values of oneDNN's own tests (test_dequantize.cpp) ---------------------------


def test_onednn_golden_with_zps():
    """Zero points of each dtype: int32, int8, uint8."""
    src = np.array([0, 10, 20, 30], u8)
    for zp_dtype in (np.int32, np.int8, np.uint8):
        got = dynamic_dequantize(src, np.array([0.1], f32), np.array([10], zp_dtype))
        assert same_bits(got, np.array([-1, 0, 1, 2], f32)), zp_dtype


def test_onednn_golden_without_zps():
    got = dynamic_dequantize(np.array([0, 10, 20, 30], u8), np.array([0.1], f32))
    assert same_bits(got, (np.array([0, 10, 20, 30], f32) * f32(0.1)))
    assert np.allclose(got, [0, 1, 2, 3])


def test_multiplies_never_divides():
    got = dynamic_dequantize(np.array([4], u8), np.array([0.5], f32), np.array([2], u8))
    assert got.tolist() == [1.0]  # (4 - 2) * 0.5, not (4 - 2) / 0.5


def test_onednn_conv_weights_per_channel():
    rng = np.random.default_rng(1)
    src = rng.integers(-128, 128, (2, 64, 3, 3), dtype=i8)
    scales = rng.random(64, dtype=f32)
    assert same_bits(dynamic_dequantize(src, scales, qtype="per_channel", axis=1), oracle(src, scales, None, "per_channel", 1))


def test_onednn_transposed_src_per_channel_one_zp():
    # sdpa-compressed-k: s8 K [1,32,128,32] with stride [..,1,128], per_channel axis=3, zps [1]
    rng = np.random.default_rng(2)
    src = rng.integers(-128, 128, (1, 32, 32, 128), dtype=i8).transpose(0, 1, 3, 2)
    assert src.shape == (1, 32, 128, 32) and not src.flags.c_contiguous
    scales = rng.random(32, dtype=f32)
    zps = np.array([3], i8)
    got = dynamic_dequantize(src, scales, zps, qtype="per_channel", axis=3)
    assert same_bits(got, oracle(src, scales, zps, "per_channel", 3))


# -- exactness at the edges ----------------------------------------------------------------------

EDGE_ZPS = [-(2**31), -(2**31) + 1, -(2**24) - 1, -(2**23) - 1, -(2**23), -128, -1, 0, 1, 255, 2**23, 2**23 + 1,
            2**24 - 1, 2**24, 2**24 + 1, 2**30 + 3, 2**31 - 2, 2**31 - 1]


@pytest.mark.parametrize("src_dtype", [i8, u8])
def test_int32_zero_points_at_the_edges_per_tensor(src_dtype):
    """Every src value against each of EDGE_ZPS (int32's ends, float32's exact-integer bound 2**24)."""
    info = np.iinfo(src_dtype)
    src = np.arange(info.min, info.max + 1, dtype=np.int64).astype(src_dtype)
    scales = np.array([1.0], f32)
    for zp in EDGE_ZPS:
        got = dynamic_dequantize(src, scales, np.array([zp], i32))
        expect = oracle(src, scales, np.array([zp], i32))
        assert same_bits(got, expect), zp
        # with scale 1 the result is the int64 difference rounded once to float32
        assert same_bits(got, (src.astype(np.int64) - zp).astype(f32)), zp


@pytest.mark.parametrize("src_dtype", [i8, u8])
def test_int32_zero_points_at_the_edges_per_channel(src_dtype):
    info = np.iinfo(src_dtype)
    values = np.arange(info.min, info.max + 1, dtype=np.int64).astype(src_dtype)
    src = np.tile(values[:, None], (1, len(EDGE_ZPS)))
    scales = np.linspace(-3, 3, len(EDGE_ZPS)).astype(f32)
    zps = np.array(EDGE_ZPS, i32)
    for s, ax in ((src, 1), (src.T.copy(), 0), (src.T, 0), (src[::-1], -1)):
        assert same_bits(dynamic_dequantize(s, scales, zps, qtype="per_channel", axis=ax),
                         oracle(s, scales, zps, "per_channel", ax))


SPECIAL = np.array(
    [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.17549435e-38,
     np.finfo(f32).max, -np.finfo(f32).max, 0.1, -2.5],
    f32,
)
PAYLOAD_NAN = np.array([0x7FC12345, 0xFFA00001, 0x7F800001], np.uint32).view(f32)  # quiet/signalling payloads


@pytest.mark.parametrize("src_dtype", [i8, u8])
def test_special_scales_bitwise(src_dtype):
    """Every src value times each special scale, per tensor and per channel, with no zero point
    and with zero points 0 (uint8), 7 (int8), -5 and 2**31 - 1 (int32)."""
    info = np.iinfo(src_dtype)
    src = np.arange(info.min, info.max + 1, dtype=np.int64).astype(src_dtype)
    for zps in (None, np.array([0], u8), np.array([7], i8), np.array([-5], i32), np.array([2**31 - 1], i32)):
        for s in list(SPECIAL) + list(PAYLOAD_NAN):
            scale = np.array([s], f32)
            assert same_bits(dynamic_dequantize(src, scale, zps), oracle(src, scale, zps)), (s, zps)
        # per channel, every special value on its own channel
        scales = np.concatenate([SPECIAL, PAYLOAD_NAN])
        srcc = np.tile(src[:, None], (1, scales.size))
        z = None if zps is None else np.full(scales.size, zps[0], zps.dtype)
        assert same_bits(dynamic_dequantize(srcc, scales, z, qtype="per_channel", axis=1),
                         oracle(srcc, scales, z, "per_channel", 1)), zps


def test_negative_zero_and_subnormal_results():
    got = dynamic_dequantize(np.array([5, 6, 4], u8), np.array([-1e-45], f32), np.array([5], u8))
    assert got.view(np.uint32).tolist() == [0x80000000, 0x80000001, 0x00000001]


# -- layouts, views and ownership ---------------------------------------------------------------


def _layouts(a):
    yield "contiguous", a
    yield "fortran", np.asfortranarray(a)
    if a.ndim:
        yield "reversed", a[::-1]
        yield "last-reversed", a[..., ::-1]
        big = np.repeat(a, 2, axis=-1)
        yield "strided", big[..., ::2]
        yield "transposed", np.ascontiguousarray(a.T).T
    ro = a.copy()
    ro.flags.writeable = False
    yield "read-only", ro


@pytest.mark.parametrize("qtype,axis", [("per_tensor", 1), ("per_channel", 0), ("per_channel", 1), ("per_channel", -1)])
def test_views_and_layouts(qtype, axis):
    """Each layout of src and of the parameters, with no zero point and zero points of each dtype."""
    for zp_dtype in (None, i8, u8, i32):
        _views_and_layouts(qtype, axis, zp_dtype)


def _views_and_layouts(qtype, axis, zp_dtype):
    rng = np.random.default_rng(6)
    src = rng.integers(-128, 128, (5, 6, 7), dtype=i8)
    C = src.shape[axis] if qtype == "per_channel" else 1
    scales = rng.standard_normal(C).astype(f32)
    zps = None if zp_dtype is None else rng.integers(0, 100, C).astype(zp_dtype)
    expect_by = {}
    for name, s in _layouts(src):
        expect = oracle(s, scales, zps, qtype, axis)
        got = dynamic_dequantize(s, scales, zps, qtype=qtype, axis=axis)
        assert same_bits(got, expect), name
        expect_by[name] = expect
    # parameters as views too: reversed, strided, read-only, non-native byte order
    for name, sc in _layouts(scales):
        if sc.ndim == 1:
            assert same_bits(dynamic_dequantize(src, sc, zps, qtype=qtype, axis=axis), oracle(src, sc, zps, qtype, axis)), name
    be_scales = scales.astype(">f4")
    be_zps = None if zps is None else zps.astype(zps.dtype.newbyteorder(">"))
    assert same_bits(dynamic_dequantize(src, be_scales, be_zps, qtype=qtype, axis=axis), oracle(src, scales, zps, qtype, axis))


def test_inputs_never_modified_and_out_filled():
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (300, 40), dtype=u8)
    scales = rng.random(40, dtype=f32)
    zps = rng.integers(0, 256, 40, dtype=u8)
    copies = [a.copy() for a in (src, scales, zps)]
    out = np.full(src.shape, 123.0, f32)
    ret = dynamic_dequantize(src, scales, zps, qtype="per_channel", axis=1, out=out)
    assert ret is out
    assert same_bits(out, oracle(src, scales, zps, "per_channel", 1))
    for a, b in zip(copies, (src, scales, zps)):
        assert np.array_equal(a, b)


def test_out_any_layout():
    """out contiguous, transposed, big-endian, and strided backwards."""
    rng = np.random.default_rng(8)
    src = rng.integers(-128, 128, (9, 11), dtype=i8)
    scales = rng.random(11, dtype=f32)
    for make_out in (lambda shape: np.empty(shape, f32), lambda shape: np.empty(shape[::-1], f32).T,
                     lambda shape: np.empty(shape, ">f4"), lambda shape: np.empty((shape[0] * 2,) + shape[1:], f32)[::-2]):
        out = make_out(src.shape)
        ret = dynamic_dequantize(src, scales, np.array([4], i8), qtype="per_channel", axis=-1, out=out)
        assert ret is out
        assert np.array_equal(out, oracle(src, scales, np.array([4], i8), "per_channel", -1))


# -- blocks and threads: every fast path at its boundaries --------------------------------------------


@pytest.mark.parametrize("shape,qtype,axis", [
    ((TUNING.chunk - 1,), "per_tensor", 1), ((TUNING.chunk,), "per_tensor", 1), ((TUNING.chunk + 1,), "per_tensor", 1),
    ((TUNING.parallel_min + 3,), "per_tensor", 1),
    ((3, TUNING.chunk + 5), "per_channel", 0),
    ((1, TUNING.parallel_min + 7), "per_channel", 1),
    ((TUNING.parallel_min // 64 + 1, 67), "per_channel", 1),
    ((513, 517), "per_channel", -1), ((517, 513), "per_channel", 0),
    ((70, 1030), "per_channel", -1), ((70, 1024), "per_channel", 1),
    ((3, 70, 1030), "per_channel", 0), ((5, 7, 1031), "per_channel", 1),
    ((7, 3, 5462), "per_channel", 1), ((7, 3, 5461), "per_channel", 1),
    ((33, 130, 3, 3), "per_channel", 1),
])
def test_block_and_thread_boundaries(shape, qtype, axis):
    """Each shape on one thread and on two, with no zero point, uint8 ones and int32 ones (one of
    them 2**31 - 1: the exact-through-float64 path), into a new array and into out."""
    for zp_dtype in (None, u8, i32):
        rng = np.random.default_rng(sum(shape))
        src = rng.integers(0, 256, shape, dtype=u8)
        C = shape[axis] if qtype == "per_channel" else 1
        scales = rng.standard_normal(C).astype(f32)
        zps = None
        if zp_dtype is not None:
            zps = rng.integers(0, 256, C).astype(zp_dtype)
            if zp_dtype is i32:
                zps[0] = 2**31 - 1  # the exact-through-float64 path
        expect = oracle(src, scales, zps, qtype, axis)
        for threads in (1, 2):
            with tuned(cores=2, small=0):
                got = dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, threads=threads)
                assert same_bits(got, expect), (zp_dtype, threads)
                out = np.empty_like(got)
                assert same_bits(dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, out=out, threads=threads),
                                 expect), (zp_dtype, threads)


def test_small_tensors_never_touch_the_pool(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the thread pool was used for a small tensor")

    monkeypatch.setattr(parallel, "_submit", boom)
    src = np.zeros((1, 64), i8)
    dynamic_dequantize(src, np.ones(64, f32), np.zeros(64, i8), qtype="per_channel", axis=1, threads=8)
    dynamic_dequantize(np.zeros(TUNING.parallel_min - 1, u8), np.ones(1, f32))


# -- property-based: everything against the oracle -------------------------------------------------

_ZP_ELEMENTS = {
    "int8": st.integers(-128, 127),
    "uint8": st.integers(0, 255),
    "int32": st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from(EDGE_ZPS), st.integers(-300, 300)),
}
_SCALE_ELEMENTS = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([float(x) for x in SPECIAL if not np.isnan(x)]),
)


@st.composite
def dequantize_problems(draw):
    src_dtype = draw(st.sampled_from(["int8", "uint8"]))
    qtype = draw(st.sampled_from(["per_tensor", "per_channel"]))
    rank = draw(st.integers(0 if qtype == "per_tensor" else 1, 8))
    max_dim = 6 if rank <= 3 else 3
    shape = tuple(draw(st.lists(st.integers(0, max_dim), min_size=rank, max_size=rank)))
    if draw(st.booleans()) and 0 in shape:  # mostly non-empty, sometimes empty
        shape = tuple(d or 1 for d in shape)
    axis = draw(st.integers(-rank, rank - 1)) if rank else 1
    if qtype == "per_channel":
        C = shape[axis]
        scale_shape = (C,)
    else:
        C = 1
        scale_shape = draw(st.sampled_from([(1,), ()]))
    zp_dtype = draw(st.sampled_from([None, "int8", "uint8", "int32"]))
    zp_shape = None
    if zp_dtype is not None:
        zp_shape = scale_shape if qtype == "per_channel" and draw(st.booleans()) else draw(st.sampled_from([(1,), ()]))
    src = draw(hnp.arrays(src_dtype, shape))
    scales = draw(hnp.arrays("float32", scale_shape, elements=_SCALE_ELEMENTS))
    zps = None if zp_dtype is None else draw(hnp.arrays(zp_dtype, zp_shape, elements=_ZP_ELEMENTS[zp_dtype]))
    layout = draw(st.sampled_from(["c", "f", "reversed", "strided", "readonly"]))
    if layout == "f":
        src = np.asfortranarray(src)
    elif layout == "reversed" and rank:
        src = np.ascontiguousarray(src[::-1])[::-1]
    elif layout == "strided" and rank:
        src = np.repeat(src, 2, axis=-1)[..., ::2]
    elif layout == "readonly":
        src.flags.writeable = False
    if draw(st.booleans()):
        scales = scales.astype(">f4")
    if zps is not None and draw(st.booleans()):
        zps = zps.astype(zps.dtype.newbyteorder(">"))
    use_out = draw(st.sampled_from([None, "c", "strided"]))
    chunk = draw(st.sampled_from([None, 1, 2, 5, 16, 64]))
    threads = draw(st.sampled_from([None, 1, 2]))
    return src, scales, zps, qtype, axis, use_out, chunk, threads


def test_property_matches_oracle_bitwise(kernel_path):
    """Everything against the oracle; the full budget on the path that serves (budget())."""

    @settings(max_examples=budget(kernel_path, 400), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(dequantize_problems())
    def check(problem):
        src, scales, zps, qtype, axis, use_out, chunk, threads = problem
        copies = [None if a is None else a.copy() for a in (src, scales, zps)]
        expect = oracle(src, scales, zps, qtype, axis)
        out = None
        if use_out == "c":
            out = np.empty(src.shape, f32)
        elif use_out == "strided" and src.ndim:
            out = np.empty(src.shape[:-1] + (src.shape[-1] * 2,), f32)[..., ::2]
        if chunk is None:
            got = dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, out=out, threads=threads)
        else:
            with tiny_blocks(chunk):
                got = dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, out=out, threads=threads)
        if out is not None:
            assert got is out
        assert same_bits(got, expect)
        # opcheck: shape function and kernel agree
        spec = DYNAMIC_DEQUANTIZE_1.shape_inference(
            TensorSpec.of(src), TensorSpec.of(scales), None if zps is None else TensorSpec.of(zps), qtype=qtype, axis=axis
        )
        assert spec == TensorSpec("float32", got.shape) == TensorSpec.of(got)
        for a, b in zip(copies, (src, scales, zps)):
            assert a is None or (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())

    check()


def test_ranks_zero_to_eight():
    """Per tensor at each rank from 0 to 8, and per channel along each of its axes."""
    for rank in range(0, 9):
        rng = np.random.default_rng(rank)
        shape = tuple(int(d) for d in rng.integers(1, 4, rank))
        src = rng.integers(-128, 128, shape, dtype=i8)
        zps = np.array([-3], i32)
        assert same_bits(dynamic_dequantize(src, np.array([0.25], f32), zps), oracle(src, np.array([0.25], f32), zps))
        for axis in range(-rank, rank):
            scales = rng.standard_normal(shape[axis]).astype(f32)
            z = rng.integers(-128, 128, shape[axis]).astype(i8)
            assert same_bits(dynamic_dequantize(src, scales, z, qtype="per_channel", axis=axis),
                             oracle(src, scales, z, "per_channel", axis)), (rank, axis)


def test_empty_tensors():
    for shape, qtype, axis, C in [((0,), "per_tensor", 1, 1), ((0, 3), "per_channel", 1, 3), ((4, 0), "per_channel", 1, 0),
                                  ((0, 0, 5), "per_channel", -1, 5), ((2, 0, 2), "per_channel", 1, 0)]:
        src = np.zeros(shape, u8)
        got = dynamic_dequantize(src, np.ones(C, f32), np.zeros(C, u8), qtype=qtype, axis=axis)
        assert got.shape == shape and got.dtype == f32
        out = np.empty(shape, f32)
        assert dynamic_dequantize(src, np.ones(C, f32), qtype=qtype, axis=axis, out=out) is out


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_an_np_matrix_src_is_taken_as_its_plain_array():
    """Over 2**18 elements (the blocked path): np.matrix broke NumPy's broadcasting there."""
    w = np.matrix(np.arange(2 * 2**18, dtype=np.int64).reshape(2, 2**18) % 256 - 128).astype(i8)
    for kernel in (dynamic_dequantize, dyndq.dynamic_dequantize):
        for scales, qtype in ((np.array([0.5], f32), "per_tensor"), (np.array([0.5, 0.25], f32), "per_channel")):
            got = kernel(w, scales, qtype=qtype, axis=0)
            assert type(got) is np.ndarray and same_bits(got, oracle(np.asarray(w), scales, None, qtype, 0))
