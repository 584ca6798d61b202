"""The compiled kernel on the code types of DequantizeLinear-28 (kernels/_native*.c/h, kernels/native.py):
int2/uint2, int16/uint16/int32, the float8, float6 and float4 codes, float8_e8m0fnu scales, zero points
of every integer dtype, outputs of any of the three dtypes whatever the scales' dtype.  Each result
is compared bit for bit with the oracle below, written here in plain NumPy and ml_dtypes, at every
level this CPU has, each checked to be the level that ran."""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cases import along_src

from dyndq.kernels import native
from dyndq.kernels.geometry import view
from dyndq.kernels.parallel import tuned
from dyndq.opdefs import dtypes

pytestmark = pytest.mark.native  # (skipped, saying why, where it is not built: tests/conftest.py)

INTEGER = ("int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32")
FLOAT = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn", "float6_e2m3fn",
         "float6_e3m2fn")
NEW = ("int2", "uint2", "int16", "uint16", "int32") + FLOAT
ONE_BYTE_NEW = ("int2", "uint2") + FLOAT
SCALES = ("float32", "float16", "bfloat16", "float8_e8m0fnu")
OUTPUTS = ("float32", "float16", "bfloat16")
VARIANT = ("scalar", "avx2", "avx512")  # the variant each level's table holds (kernels/_native.c)
LEVELS = [pytest.param(k, id=name, marks=pytest.mark.skipif(
              native.built() and k > native.cpu_level(),
              reason=f"no {name} variant here (this CPU, or a build without it: native.info())"))
          for k, name in enumerate(VARIANT)]
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def dt(name) -> np.dtype:
    return dtypes.by_name(name).numpy


# -- the oracle ----------------------------------------------------------------------------------------


def quiet(bits: np.ndarray) -> np.ndarray:
    return bits | np.uint32(0x00400000)


def oracle(src, scales, zps, qtype, axis, group_shape, ot) -> np.ndarray:
    """out = OT(float32(decode(src) - decode(zp)) * float32(decode(scale))), parameters repeated to
    src's shape: integer codes as int64, their difference rounded once to float32 (NumPy's cast:
    nearest even); float codes and scales as ml_dtypes decodes them, float codes' zero points (zeros)
    subtracted in float32 (IEEE's: -0 - (-0) = +0); one float32 multiply, a NaN
    operand giving its own NaN made quiet, the difference's first (x86's rule, the kernel's
    operand order); then ml_dtypes' / NumPy's cast to OT, every float16 NaN 0x7E00."""
    src = np.asarray(src)
    scale = np.asarray(scales).astype(np.float32)
    integer = dtypes.of(src.dtype).is_integer
    zp = np.zeros((), np.int64) if zps is None else np.asarray(zps).astype(np.int64 if integer else np.float32)
    scale, zp = along_src(src, scale, zp, qtype, axis, group_shape)
    if integer:
        d = (src.astype(np.int64) - zp).astype(np.float32)
    elif zps is None:
        d = src.astype(np.float32)
    else:
        assert not np.any(zp), "float codes take zeros as zero points"
        with np.errstate(all="ignore"):
            d = src.astype(np.float32) - zp
    d, scale = np.broadcast_arrays(d, scale)
    with np.errstate(all="ignore"):
        p = np.multiply(d, scale, dtype=np.float32)
        p_bits = p.view(np.uint32).copy()
        d_nan, s_nan = np.isnan(d), np.isnan(scale)
        p_bits[s_nan] = quiet(np.ascontiguousarray(scale).view(np.uint32))[s_nan]
        p_bits[d_nan] = quiet(np.ascontiguousarray(d).view(np.uint32))[d_nan]
        out = p_bits.view(np.float32).astype(dt(ot))
    if ot == "float16":
        out.view(np.uint16)[np.isnan(out)] = 0x7E00
    return out.reshape(src.shape)


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(_RAW[a.dtype.itemsize]), np.ascontiguousarray(b).view(_RAW[b.dtype.itemsize]))


# -- running the kernel ---------------------------------------------------------------------------------


@contextlib.contextmanager
def at(level):
    """The compiled kernel at `level`, checked to be what runs: the level in force and the variant
    its table calls (not merely asked for)."""
    with native.at_level(level):
        assert native.level() == level
        assert native.info()["entries"]["dequantize"] == VARIANT[level]
        yield


def vform(shape, qtype, axis, group_shape):
    """The view native.dequantize takes, as the op's kernel makes it (kernels/dynamic_dequantize.py)."""
    if qtype == "per_tensor" or len(shape) == 0:
        return (max(int(np.prod(shape)), 1),), (False,)
    return view(shape, qtype, axis, group_shape)


def run(src, scales, zps, qtype, axis, group_shape, ot, *, out=None, threads=None):
    out = np.zeros(src.shape, dt(ot)) if out is None else out
    vshape, varies = vform(src.shape, qtype, axis, group_shape)
    return native.dequantize(src, scales, zps, vshape, varies, out, threads)


def cut_run(src, scales, zps, qtype, axis, group_shape, out, cuts, stream):
    """The C loop over [a, b) for each pair of cuts, with the arguments native.py passes (as
    threads cut the work: mid-row, mid-group)."""
    vshape, varies = vform(src.shape, qtype, axis, group_shape)
    head, kinds = native.c_args(src, scales, zps, vshape, varies, out)
    for a, b in zip(cuts, cuts[1:]):
        native._native.dequantize(*head, a, b, stream, *kinds)
    return out


def agrees(src, scales, zps=None, qtype="per_tensor", axis=1, group_shape=None, ot="float32", **kw):
    got = run(src, scales, zps, qtype, axis, group_shape, ot, **kw)
    want = oracle(src, scales, zps, qtype, axis, group_shape, ot)
    assert same_bits(got, want), (src.dtype, np.asarray(scales).dtype, None if zps is None else zps.dtype, ot,
                                  int(np.count_nonzero(got.view(_RAW[got.itemsize]) != want.view(_RAW[got.itemsize]))))


# -- values --------------------------------------------------------------------------------------------


def every_byte(name, count) -> np.ndarray:
    """count bytes cycling through all 256 (the whole code space of a one-byte type, the bits
    beyond its width included), as codes of the type."""
    return (np.arange(count) % 256).astype(np.uint8).view(dt(name))


def ints(rng, name, shape) -> np.ndarray:
    lo, hi = dtypes.integer_range(name)
    a = rng.integers(lo, hi, int(np.prod(shape)), endpoint=True)
    if name in ("int16", "uint16", "int32"):  # the ends of the range too
        a[: min(a.size, 2)] = [lo, hi][: min(a.size, 2)]
    return a.astype(dt(name)).reshape(shape)


def codes(rng, name, shape) -> np.ndarray:
    """Random codes: values of an integer type; any byte for the one-byte float types."""
    if dtypes.by_name(name).is_integer:
        return ints(rng, name, shape)
    return rng.integers(0, 256, shape, dtype=np.uint8).view(dt(name))


def scales_of(rng, name, shape) -> np.ndarray:
    """Ordinary scales with any bit pattern at a quarter of them (NaN payloads and signs, infinities,
    subnormals, -0); float8_e8m0fnu: any byte (0: 2**-127, a float32 subnormal; 255: NaN)."""
    n = int(np.prod(shape))
    if name == "float8_e8m0fnu":
        return rng.integers(0, 256, n, dtype=np.uint8).view(dt(name)).reshape(shape)
    s = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 4, n)).astype(np.float32).astype(dt(name))
    raw_t = _RAW[dt(name).itemsize]
    raw = rng.integers(0, np.iinfo(raw_t).max, n, dtype=raw_t, endpoint=True)
    pick = rng.random(n) < 0.25
    s.view(raw_t)[pick] = raw[pick]
    return s.reshape(shape)


def special_scales(name) -> np.ndarray:
    """NaNs (payloads, signs; signaling ones), infinities, +-0, subnormals, the largest finite."""
    if name == "float8_e8m0fnu":
        return np.array([0, 1, 2, 127, 128, 254, 255], np.uint8).view(dt(name))
    bits = {"float32": [0x7FC12345, 0xFFA00001, 0x7F800001, 0x7F800000, 0xFF800000, 0, 0x80000000, 1, 0x7F7FFFFF,
                        0x3F800000, 0x00400000],
            "float16": [0x7E01, 0xFC01, 0x7C01, 0x7C00, 0xFC00, 0, 0x8000, 1, 0x7BFF, 0x3C00, 0x0200],
            "bfloat16": [0x7FC1, 0xFF81, 0x7F81, 0x7F80, 0xFF80, 0, 0x8000, 1, 0x7F7F, 0x3F80, 0x0040]}[name]
    return np.array(bits, _RAW[dt(name).itemsize]).view(dt(name))


def zero_points(rng, name, shape, src_name) -> np.ndarray:
    """Zero points of a dtype; int32 ones out at both ends of the range half of the time, where
    src - zp overflows int32 (the wide subtraction) and its rounding to float32 matters."""
    z = ints(rng, name, shape)
    if name == "int32" and rng.random() < 0.5:
        ends = rng.integers(2**31 - 70000, 2**31, shape) * rng.choice([-1, 1], shape)
        z = np.clip(ends, -(2**31), 2**31 - 1).astype(np.int32)
    return z


# -- the whole code space of each type ---------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ONE_BYTE_NEW)
def test_every_byte_of_a_one_byte_type(level, name):
    """Every byte as a code (NaN codes, infinities, bits beyond the type's width), per group along the
    last axis (groups of 7: a scale for every few codes, so each meets many scales) in rows of an
    odd length, every scale dtype (special values among them) and output dtype; integer codes with
    zero points of every integer dtype too."""
    rng = np.random.default_rng(sum(map(ord, name)))
    src = every_byte(name, 3 * 7 * 37).reshape(3, 7 * 37)
    zp_names = (None,) + INTEGER if dtypes.by_name(name).is_integer else (None,)
    with at(level):
        for sname in SCALES:
            scales = scales_of(rng, sname, (3, 37))
            sp = special_scales(sname)
            scales.reshape(-1)[: sp.size] = sp
            for zname in zp_names:
                zps = None if zname is None else zero_points(rng, zname, (3, 37), name)
                for ot in OUTPUTS:
                    agrees(src, scales, zps, "per_group", 1, [1, 7], ot)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["int16", "uint16"])
def test_every_value_of_a_16_bit_type(level, name):
    """All 65536 codes, per channel along the last axis (a scale and zero point at every element,
    widened a block at a time), with zero points of every integer dtype (int32 ones far out, where
    src - zp overflows int32)."""
    rng = np.random.default_rng(len(name))
    src = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dt(name)).reshape(256, 256)
    with at(level):
        for sname, zname in zip(SCALES, (None, "int32", "uint16", "int2")):
            scales = scales_of(rng, sname, (256,))
            zps = None if zname is None else zero_points(rng, zname, (256,), name)
            for ot in OUTPUTS:
                agrees(src, scales, zps, "per_channel", 1, None, ot)
        for zname in INTEGER:
            zps = zero_points(rng, zname, (64,), name)
            agrees(src, scales_of(rng, "float32", (64, 1)), zps.reshape(64, 1), "per_group", 1, [4, 256], "float16")


@pytest.mark.parametrize("level", LEVELS)
def test_int32_codes_with_zero_points_near_the_ends(level):
    """int32 codes at and near both ends with int32 zero points near +-2**31: the exact difference
    (up to 2**32 - 1) rounded once to float32, nearest even (ties among them)."""
    rng = np.random.default_rng(32)
    edge = np.array([-(2**31), -(2**31) + 1, 2**31 - 1, 2**31 - 2, 0, 1, -1, 2**24, 2**24 + 1, -(2**24) - 1,
                     2**25 + 2, 2**31 - 129, 2**31 - 128, 2**31 - 127, -(2**31) + 128, -(2**31) + 129], np.int64)
    src = np.concatenate([edge, rng.integers(-(2**31), 2**31, 16 * 63 - edge.size)]).astype(np.int32).reshape(16, 63)
    zps = np.array([2**31 - 1, -(2**31), 2**31 - 128, -(2**31) + 127, 1 << 30, -(1 << 30), 12345, 0,
                    2**31 - 65536, -(2**31) + 65535, 2**31 - 3, -(2**31) + 3, 7, -7, 2**31 - 129, -(2**31) + 129],
                   np.int64).astype(np.int32)
    with at(level):
        for ot in OUTPUTS:
            for sname in SCALES:
                scales = scales_of(rng, sname, (16,))
                agrees(src, scales, zps, "per_channel", 0, None, ot)
                agrees(src, scales.reshape(16, 1), zps.reshape(16, 1), "per_group", 1, [1, 63], ot)
            agrees(src, np.array([0.5], np.float32), np.array([2**31 - 1], np.int32), "per_tensor", 1, None, ot)
            agrees(src, np.array(1.0, np.float32), np.array(-(2**31), np.int32), "per_tensor", 1, None, ot)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("src_name", INTEGER)
def test_every_zero_point_dtype_with_every_integer_code_type(level, src_name):
    """Each integer code type with zero points of each integer dtype (per group along either axis:
    the groups' loops, and per tensor: one zero point), in sizes leaving tails."""
    rng = np.random.default_rng(len(src_name) * 7)
    src = codes(rng, src_name, (24, 75))
    with at(level):
        for zname in INTEGER:
            zps = zero_points(rng, zname, (8, 5), src_name)
            agrees(src, scales_of(rng, "float16", (8, 5)), zps, "per_group", 1, [3, 15], "bfloat16")
            zt = zero_points(rng, zname, (1,), src_name)
            agrees(src, scales_of(rng, "float8_e8m0fnu", (1,)), zt, "per_tensor", 1, None, "float32")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", NEW)
def test_every_scale_and_output_dtype_in_every_form(level, name):
    """Each new code type with each scale dtype and each output dtype, per tensor, per channel and
    per group, without zero points and (integer codes) with them, a zero-point dtype per scale
    dtype in turn."""
    rng = np.random.default_rng(sum(map(ord, name)) + 1)
    src = codes(rng, name, (6, 48 + 5))
    integer = dtypes.by_name(name).is_integer
    forms_ = [("per_tensor", 1, None, (1,)), ("per_channel", 0, None, (6,)), ("per_group", 1, [2, 53], (3, 1)),
              ("per_group", 0, [3, 1], (2, 53))]
    with at(level):
        for k, sname in enumerate(SCALES):
            for qtype, axis, groups, pshape in forms_:
                scales = scales_of(rng, sname, pshape)
                for zname in (None, INTEGER[(k * 3 + len(name)) % len(INTEGER)]) if integer else (None,):
                    zps = None if zname is None else zero_points(rng, zname, pshape, name)
                    for ot in OUTPUTS:
                        agrees(src, scales, zps, qtype, axis, groups, ot)


@pytest.mark.parametrize("level", LEVELS)
def test_other_layouts_of_every_input(level):
    """Codes, scales and zero points as strided views (native.py makes them contiguous), 2- and
    4-byte codes included."""
    rng = np.random.default_rng(13)
    with at(level):
        for name in ("int16", "int32", "float8_e5m2", "uint2"):
            src = codes(rng, name, (40, 66))[::2, ::-2]  # (20, 33), negative strides
            scales = scales_of(rng, "bfloat16", (10, 6))[::2, ::2]  # (5, 3)
            zps = None if name.startswith("float") else zero_points(rng, "int16", (5, 6), name)[:, ::2]
            assert not src.flags.c_contiguous and not scales.flags.c_contiguous
            agrees(src, scales, zps, "per_group", 1, [4, 11], "float16")


# -- forms: any shape, axis and groups, cut anywhere, any output alignment -------------------------------


@st.composite
def forms(draw):
    """Any new code type with any scale and output dtype, zero points of any integer dtype (integer
    codes; float codes: zeros of either sign, of their own type); per tensor ([1] or []), per channel on any axis (zero points per channel or one),
    per group of any shape (groups of 1 to 70, up to three dims); cut at up to four places, streamed
    or not, into an output starting anywhere in a 64-byte line."""
    src_name = draw(st.sampled_from(NEW + ("int4", "int8")))
    sname, ot = draw(st.sampled_from(SCALES)), draw(st.sampled_from(OUTPUTS))
    zname = draw(st.sampled_from((None,) + INTEGER) if dtypes.by_name(src_name).is_integer
                 else st.sampled_from((None, "signed zeros")))
    rank = draw(st.integers(1, 3))
    qtype = draw(st.sampled_from(["per_tensor", "per_channel", "per_group"]))
    axis, group_shape = 0, None
    if qtype == "per_group":
        group_shape = [draw(st.sampled_from([1, 2, 3, 7, 16, 32, 33, 70])) for _ in range(rank)]
        counts = [draw(st.integers(1, 4)) for _ in range(rank)]
        shape = tuple(g * c for g, c in zip(group_shape, counts))
        pshape = tuple(counts)
    else:
        shape = tuple(draw(st.integers(1, 40)) for _ in range(rank))
        axis = draw(st.integers(-rank, rank - 1))
        pshape = (shape[axis],) if qtype == "per_channel" else draw(st.sampled_from([(1,), ()]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    src = codes(rng, src_name, shape)
    scales = scales_of(rng, sname, pshape)
    zps = None
    if zname is not None:
        one = qtype == "per_channel" and draw(st.booleans())
        zshape = (1,) if one else pshape
        zps = zero_points(rng, zname, zshape, src_name) if zname in INTEGER else \
            np.where(rng.random(zshape) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(src.dtype)
    n = src.size
    cuts = sorted({0, n, *rng.integers(0, n + 1, draw(st.integers(0, 4))).tolist()})
    return src, scales, zps, qtype, axis, group_shape, ot, cuts, draw(st.booleans()), draw(st.integers(0, 31))


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=forms())
def test_any_form_cut_anywhere_matches_the_oracle(level, form):
    src, scales, zps, qtype, axis, group_shape, ot, cuts, stream, offset = form
    want = oracle(src, scales, zps, qtype, axis, group_shape, ot)
    out = np.zeros(src.size + offset, dt(ot))[offset:].reshape(src.shape)  # any start within a line
    with at(level):
        got = cut_run(src, scales, zps, qtype, axis % src.ndim, group_shape, out, cuts, stream)
    assert same_bits(got, want)


@pytest.mark.parametrize("level", LEVELS)
def test_long_rows_reach_every_loop(level):
    """Rows long enough for the vector loops' main steps (and their streamed stores): groups of 32
    along the last axis, groups along axis 0 (a scale at every element of a row), per channel on
    the last axis; every new code type, every output dtype."""
    rng = np.random.default_rng(3)
    with at(level), tuned(stream_min=0):
        for name in NEW:
            src = codes(rng, name, (5, 1000 + 13))
            z = "uint8" if dtypes.by_name(name).is_integer else None
            for ot in OUTPUTS:
                src2 = src[:, :992]
                zps = None if z is None else zero_points(rng, z, (5, 31), name)
                agrees(src2, scales_of(rng, "float32", (5, 31)), zps, "per_group", 1, [1, 32], ot)
                zps = None if z is None else zero_points(rng, "int16", (1, 1013), name)
                agrees(src, scales_of(rng, "bfloat16", (1, 1013)), zps, "per_group", 1, [5, 1], ot)
                zps = None if z is None else zero_points(rng, "int32", (1013,), name)
                agrees(src, scales_of(rng, "float8_e8m0fnu", (1013,)), zps, "per_channel", 1, None, ot)


# -- NaN and infinity -------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_nan_code_times_a_nan_scale_is_the_codes_nan(level):
    """Both operands NaN: the product is the difference's NaN made quiet (the first operand's, as
    x86 multiplies), its sign kept; a NaN scale with a number gives the scale's NaN; infinity
    times 0 the default NaN.  Written out bit by bit, not through the oracle."""
    codes_ = np.array([0x7F, 0xFF, 0x7F, 0x38, 0x00], np.uint8).view(ml_dtypes.float8_e4m3fn)  # NaN, -NaN, NaN, 1, 0
    scales = np.array([0x7FA00001, 0x7FC12345, 0x3F800000, 0xFFC00002, 0x7F800000], np.uint32).view(np.float32)
    want = np.array([0x7FC00000, 0xFFC00000, 0x7FC00000, 0xFFC00002, 0xFFC00000], np.uint32)
    inf_code = np.array([0x7C, 0x00], np.uint8).view(ml_dtypes.float8_e5m2)  # inf, 0
    with at(level):
        for k in range(codes_.size):  # each on its own, and all in one long run (the vector steps)
            got = run(codes_[k:k + 1], scales[k:k + 1], None, "per_tensor", 1, None, "float32")
            assert got.view(np.uint32)[0] == want[k], (k, hex(got.view(np.uint32)[0]))
        many = np.resize(codes_, 5 * 40)
        got = run(many, np.resize(scales, 5 * 40), None, "per_channel", 0, None, "float32")
        assert np.array_equal(got.view(np.uint32), np.resize(want, 5 * 40))
        got = run(inf_code, np.array([0.0, np.inf], np.float32), None, "per_channel", 0, None, "float32")
        assert got.view(np.uint32).tolist() == [0xFFC00000, 0xFFC00000]


# -- the parameters and tables as given to C ---------------------------------------------------------------


def test_every_float8_e8m0fnu_scale_widens_to_its_exact_value():
    """2**(e - 127) exactly (e = 0: the float32 subnormal 2**-127), e = 255 NaN: as ml_dtypes decodes
    them, by the C side's widening (large arrays) and through the kernel."""
    e = np.tile(np.arange(256, dtype=np.uint8), 8).view(ml_dtypes.float8_e8m0fnu)
    want = e.astype(np.float32)
    assert want.view(np.uint32)[0] == 0x00400000 and want.view(np.uint32)[1] == 0x00800000
    assert np.isnan(want[255]) and want.view(np.uint32)[128] == 0x40000000  # 2.0
    assert np.array_equal(native._widened(e, np.dtype(np.float32)).view(np.uint32), want.view(np.uint32))
    for level in range(native.cpu_level() + 1):
        with at(level):
            got = run(np.ones(e.size, np.int8), e, None, "per_channel", 0, None, "float32")
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", INTEGER[:2] + INTEGER[6:8])
def test_new_zero_point_dtypes_widen_as_ml_dtypes_casts(name):
    a = np.tile(np.arange(256, dtype=np.uint32).astype(np.uint8), 8).view(np.uint8)
    a = a.view(dt(name)) if dt(name).itemsize == 1 else np.arange(-2048, 2048).astype(dt(name))
    got = native._widened(a, np.dtype(np.int32))
    assert got.dtype == np.int32 and np.array_equal(got, a.astype(np.int32))


@pytest.mark.parametrize("name", FLOAT)
def test_tables_hold_ml_dtypes_values_and_their_float16_bits(name):
    """native.py's table: the 256 float32 values ml_dtypes gives, then the same as float16 bits
    (every value of these types is a float16 value)."""
    table = native._table(dt(name))
    assert table.nbytes == 256 * 6 and not table.flags.writeable
    f32, f16 = table[:1024].view(np.float32), table[1024:].view(np.float16)
    want = np.arange(256, dtype=np.uint8).view(dt(name)).astype(np.float32)
    assert np.array_equal(f32.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(f16.astype(np.float32).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("level", LEVELS)
def test_a_float32_table_alone_gives_the_same_bits(level):
    """Given the float32 values only (no float16 bits: a type whose values were not all float16
    ones), the vector loops gather from them: the same bits."""
    rng = np.random.default_rng(8)
    for name in FLOAT:
        src = every_byte(name, 8 * 300).reshape(8, 300)
        scales = scales_of(rng, "float16", (8, 10))
        for ot in OUTPUTS:
            out = np.zeros(src.shape, dt(ot))
            vshape, varies = vform(src.shape, "per_group", 1, [1, 30])
            head, (sk, zk, table) = native.c_args(src, scales, None, vshape, varies, out)
            with at(level):
                native._native.dequantize(*head, 0, src.size, False, sk, zk, table[:1024])
            assert same_bits(out, oracle(src, scales, None, "per_group", 1, [1, 30], ot))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ot", OUTPUTS)
def test_the_lean_entry_for_one_scale(level, ot):
    """native.dequantize_one (one scale and zero point as Python numbers) on every new code type,
    with zero points at the ends of int32 (the C side picks the subtraction from src's range)."""
    rng = np.random.default_rng(11)
    with at(level):
        for name in NEW:
            src = codes(rng, name, (7, 37))
            zs = [None] + ([np.array([z], np.int32) for z in (-(2**31), 2**31 - 1, 5)]
                           if dtypes.by_name(name).is_integer else [])
            for sname in SCALES:
                scales = special_scales(sname)[rng.integers(0, 7, 1)]
                for zps in zs:
                    out = np.zeros(src.shape, dt(ot))
                    native.dequantize_one(src, scales, zps, out)
                    assert same_bits(out, oracle(src, scales, zps, "per_tensor", 1, None, ot)), (name, sname, zps)


def test_threads_cut_new_types_mid_group():
    rng = np.random.default_rng(12)
    for name in ("float8_e5m2", "int16", "int32", "int2"):
        src = codes(rng, name, (96, 160))
        scales = scales_of(rng, "float8_e8m0fnu", (96, 5))
        zps = None if name.startswith("float") else zero_points(rng, "int32", (96, 5), name)
        with tuned(chunk=1001, parallel_min=0, cores=2):  # threads start mid-group
            agrees(src, scales, zps, "per_group", 1, [1, 32], "float16", threads=2)


def test_handles_every_new_code_type_with_every_output():
    for name in NEW:
        for ot in OUTPUTS:
            assert native.handles(dt(name), dt(ot)), (name, ot)
    assert not native.handles(np.dtype(">i2"), np.dtype(np.float32))  # (non-native order: the NumPy kernel)


def test_the_c_side_refuses_a_table_that_does_not_fit():
    b = native._bytes
    src = np.zeros(8, np.uint8).view(ml_dtypes.float8_e4m3fn)
    table = native._table(src.dtype)
    kinds = native._native.KINDS
    args = (b(src), np.zeros(8, np.float32), np.ones(1, np.float32))
    tail = ((8,), (False,), kinds["src"]["float8_e4m3fn"], kinds["dst"]["float32"])
    none, narrow = kinds["zmode"]["none"], kinds["zmode"]["narrow"]
    with pytest.raises(ValueError, match="a table is given for src of kind table"):
        native._native.dequantize(*args, None, *tail, none, 0, 8, False, 0, 0)  # none given
    with pytest.raises(ValueError, match="a table is given for src of kind table"):
        native._native.dequantize(b(np.zeros(8, np.int8)), *args[1:], None, (8,), (False,), kinds["src"]["int8"],
                                  0, none, 0, 8, False, 0, 0, table)  # one given to int8
    with pytest.raises(ValueError, match="256 float32"):
        native._native.dequantize(*args, None, *tail, none, 0, 8, False, 0, 0, table[:1000])
    with pytest.raises(ValueError, match="takes float zero points or none"):
        native._native.dequantize(*args, np.zeros(1, np.int32), *tail, narrow, 0, 8, False, 0, 0, table)
    float_zp = kinds["zmode"]["float"]
    with pytest.raises(ValueError, match="float zero points go with src decoded by a table, as int32 bits"):
        native._native.dequantize(b(np.zeros(8, np.int8)), *args[1:], np.zeros(1, np.int32), (8,), (False,),
                                  kinds["src"]["int8"], 0, float_zp, 0, 8, False, 0, 0)  # integer codes
    with pytest.raises(ValueError, match="as int32 bits"):
        native._native.dequantize(*args, np.zeros(1, np.int8), *tail, float_zp, 0, 8, False, 0, kinds["zp"]["int8"],
                                  table)  # zero points of another kind
    with pytest.raises(ValueError, match="a table is given"):
        native._native.dequantize_one(b(src), np.zeros(8, np.float32), 1.0, None, kinds["src"]["float8_e4m3fn"], 0)
