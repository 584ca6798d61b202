"""The compiled kernel's own parts (kernels/_native.c, kernels/native.py): its roundings on every
rounding boundary, its work cut at any element, its switch.  Its results as a whole are
judged against the oracle by every test of test_dynamic_dequantize*.py, which run on
both kernels."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dyndq
from dyndq.kernels import native
from dyndq.kernels.geometry import view
from dyndq.kernels.parallel import NATIVE_ENV, tuned
from dyndq.opdefs import dtypes

from cases import oracle_2, same_bits

pytestmark = pytest.mark.native  # (skipped, saying why, where it is not built: tests/conftest.py)


def boundary_patterns(dropped_bits: int) -> np.ndarray:
    """Every sign, exponent and kept mantissa (the top 10 bits for float16, 7 for bfloat16),
    with the dropped bits at and around a tie, plus random patterns."""
    kept = 23 - dropped_bits
    exps = np.arange(256, dtype=np.uint32) << 23
    mant = np.arange(1 << min(kept, 10), dtype=np.uint32) << (23 - min(kept, 10))
    half = 1 << (dropped_bits - 1)
    low = np.array([0, 1, half - 1, half, half + 1, 2 * half - 1], np.uint32)
    bits = (exps[:, None, None] | mant[None, :, None] | low[None, None, :]).reshape(-1)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    rng = np.random.default_rng(0)
    return np.concatenate([bits, rng.integers(0, 2**32, 1 << 18, dtype=np.uint32)]).view(np.float32)


LEVELS = [pytest.param(k, id=name, marks=pytest.mark.skipif(
              native.built() and k > native.cpu_level(),
              reason=f"no {name} variant here (this CPU, or a build without it: native.info())"))
          for k, name in enumerate(["scalar", "avx2", "avx512"])]
VARIANT = ["scalar", "avx2", "avx512"]  # the variant each level's table holds


@contextlib.contextmanager
def at(level):
    """The kernel at `level`, checked to run that level's variant in every entry (not merely
    told to): the table the C side calls through says so."""
    with native.at_level(level):
        assert native.info()["entries"] == dict.fromkeys(("dequantize", "widen", "narrow"), VARIANT[level])
        yield


@pytest.mark.parametrize("level", LEVELS)
def test_float16_rounding_on_every_boundary(level):
    p = boundary_patterns(13)
    with np.errstate(all="ignore"):
        want = p.astype(np.float16)
    want.view(np.uint16)[np.isnan(p)] = 0x7E00  # NaNs: the one quiet NaN (kernels/narrowing.py)
    with at(level):
        assert same_bits(native.narrow(p, np.float16), want)


@pytest.mark.parametrize("level", LEVELS)
def test_bfloat16_rounding_on_every_boundary(level):
    p = boundary_patterns(16)
    with np.errstate(all="ignore"):
        want = p.astype(ml_dtypes.bfloat16)  # NaNs: 0x7FC0 with the sign, as ml_dtypes makes them
    with at(level):
        assert same_bits(native.narrow(p, ml_dtypes.bfloat16), want)


FORMS = [  # shape, qtype, axis, group_shape
    ((6, 64), "per_group", 1, [1, 32]),
    ((64, 6), "per_group", 0, [32, 1]),
    ((4, 6, 8), "per_group", 2, [2, 3, 4]),
    ((5, 7, 9), "per_channel", 1, None),
    ((5, 7), "per_channel", -1, None),
    ((300,), "per_tensor", 0, None),
]


def cut_run(src, scales, zps, shape, qtype, axis, group_shape, out, cuts, stream):
    """The C loop over [a, b) for each pair of cuts, with the arguments kernels/native.py passes."""
    vshape, varies = view(shape, qtype, axis, group_shape)
    head, kinds = native.c_args(src, scales, zps, vshape, varies, out)
    for a, b in zip(cuts, cuts[1:]):
        native._native.dequantize(*head, a, b, stream, *kinds)
    return out


@pytest.mark.parametrize("shape,qtype,axis,group_shape", FORMS)
@pytest.mark.parametrize("level", LEVELS)
def test_any_cut_of_the_elements_gives_the_whole(shape, qtype, axis, group_shape, level):
    """The C loop starts and stops anywhere: mid-row, mid-group (as threads cut it); for each T2,
    with no zero point, uint8 ones and int32 ones that make src - zp overflow int32, streamed
    (non-temporal stores) or not."""
    for t2 in ("float32", "float16", "bfloat16"):
        for zp in (None, "uint8", "wide"):
            for stream in (False, True):
                rng = np.random.default_rng(len(shape))
                src = rng.integers(-8, 8, shape).astype(ml_dtypes.int4)
                pshape = ([1] if qtype == "per_tensor" else [shape[axis]] if qtype == "per_channel"
                          else [d // g for d, g in zip(shape, group_shape)])
                scales = rng.standard_normal(pshape).astype(t2)
                zps = None if zp is None else (rng.integers(0, 256, pshape).astype(np.uint8) if zp == "uint8"
                                               else np.full(pshape, 2**31 - 1, np.int32))  # src - zp overflows int32
                expect = oracle_2(src, scales, zps, qtype, axis, group_shape)
                cuts = sorted({0, src.size, *rng.integers(0, src.size, 7).tolist()})
                with at(level):
                    got = cut_run(src, scales, zps, shape, qtype, axis, group_shape, np.zeros(shape, t2), cuts, stream)
                assert same_bits(got, expect), (t2, zp, stream)


def test_threads_cut_at_odd_places():
    src = np.random.default_rng(1).integers(0, 16, (96, 160)).astype(ml_dtypes.uint4)
    scales = np.linspace(-2, 2, 96 * 5).astype(np.float16).reshape(96, 5)
    zps = np.full((96, 5), 3, np.uint8)
    expect = oracle_2(src, scales, zps, "per_group", 1, [1, 32])
    with tuned(chunk=1001, parallel_min=0, cores=2, native=True):  # threads start mid-group
        got = dyndq.dynamic_dequantize(src, scales, zps, qtype="per_group", group_shape=[1, 32], threads=2)
    assert same_bits(got, expect)


def test_other_layouts_of_every_input():
    rng = np.random.default_rng(2)
    src = np.asfortranarray(rng.integers(-128, 128, (64, 96), dtype=np.int8))
    scales = np.asfortranarray(rng.standard_normal((2, 3)).astype(">f4"))  # big-endian, column-major
    zps = np.asfortranarray(rng.integers(-5, 5, (2, 3)).astype(np.int32))
    expect = oracle_2(src, scales.astype(np.float32), zps, "per_group", 1, [32, 32])
    with tuned(native=True):
        got = dyndq.dynamic_dequantize(src, scales, zps, qtype="per_group", group_shape=[32, 32])
    assert same_bits(got, expect)


def test_a_level_above_the_cpus_is_refused():
    with pytest.raises(ValueError, match="this CPU has levels 0 to"):
        native._native.set_level(native.cpu_level() + 1)
    assert native.level() == native.cpu_level()


def test_the_c_side_refuses_buffers_too_small():
    src = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="out holds 8 bytes, 40 needed"):
        native._native.dequantize(src, np.zeros(2, np.float32), np.ones(1, np.float32), None, (10,), (False,),
                                  1, 0, 0, 0, 10, False, 0, 0)
    with pytest.raises(ValueError, match="start and stop"):
        native._native.dequantize(src, np.zeros(10, np.float32), np.ones(1, np.float32), None, (10,), (False,),
                                  1, 0, 0, 5, 11, False, 0, 0)


@pytest.mark.parametrize("value,on", [("0", False), ("off", False), ("1", True), (None, True)])
def test_the_environment_variable_sets_the_default(value, on):
    env = {k: v for k, v in os.environ.items() if k != NATIVE_ENV}
    if value is not None:
        env[NATIVE_ENV] = value
    code = "from dyndq.kernels.parallel import TUNING; print(TUNING.native)"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert got.strip() == str(on)


def test_off_means_the_numpy_kernel(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the compiled kernel ran")

    monkeypatch.setattr(native._native, "dequantize", boom)
    monkeypatch.setattr(native._native, "dequantize_one", boom)
    src = np.arange(12, dtype=np.uint8).reshape(3, 4)
    with tuned(native=False):
        dyndq.dynamic_dequantize(src, np.array([0.5], np.float32))
    with tuned(native=True), pytest.raises(AssertionError, match="compiled kernel ran"):
        dyndq.dynamic_dequantize(src, np.array([0.5], np.float32))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_scales_widen_as_numpy_casts_every_pattern(dtype):
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)  # NaN payloads and subnormals too
    assert same_bits(native._widened(a, np.dtype(np.float32)), a.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, ml_dtypes.int4, ml_dtypes.uint4])
def test_zero_points_widen_as_numpy_casts_every_byte(dtype):
    a = np.tile(np.arange(256, dtype=np.uint32).astype(np.uint8), 8).view(dtype)  # int4: high nibbles ignored
    got = native._widened(a, np.dtype(np.int32))
    assert got.dtype == np.int32 and np.array_equal(got, a.astype(np.int32))


@pytest.mark.parametrize("t2", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("zp", [None, np.int8(-3), np.uint8(200), np.int32(2**31 - 1), np.int32(-(2**31)),
                                np.int32(2**31 - 256), np.int32(-(2**31) + 255)])
def test_the_lean_entry_for_one_scale(t2, zp):
    """One scale and one zero point go to C as Python numbers: every dtype, both integer widths."""
    src = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    scales = np.array([0.3], t2)
    zps = None if zp is None else np.array([zp])
    out = np.zeros(src.shape, t2)
    native.dequantize_one(src, scales, zps, out)
    assert same_bits(out, oracle_2(src, scales, zps, "per_tensor", 0, None))
    with pytest.raises(ValueError, match="beyond int32"):
        native._native.dequantize_one(src, out, 1.0, 2**31, 0, 0)


# -- the fused loops (AVX-512) and the loops beside them, on forms long enough to reach them ---------

_RAW = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32}


def _scales(rng, t2, shape):
    """Ordinary scales of t2, with any bit pattern at a quarter of them (NaN payloads and signs,
    infinities, subnormals)."""
    s = (rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 4, shape)).astype(np.float32).astype(t2)
    raw = rng.integers(0, np.iinfo(_RAW[t2]).max, shape, dtype=_RAW[t2], endpoint=True)
    pick = rng.random(shape) < 0.25
    s.view(_RAW[t2])[pick] = raw[pick]
    return s


def _ints(rng, name, shape, high_bits=False):
    """Random values of an integer dtype; for 4-bit ones, maybe with random high nibbles (read
    as the low nibble, as ml_dtypes reads it)."""
    if name == "wide":  # int32 zero points far enough out that src - zp overflows int32
        return (rng.integers(2**31 - 300, 2**31, shape) * rng.choice([-1, 1], shape)).astype(np.int32)
    if name == "int32":  # up to the narrow bound, and small ones
        big = rng.integers(-native._NARROW_ZP, native._NARROW_ZP, shape, endpoint=True)
        return np.where(rng.random(shape) < 0.5, big, rng.integers(-20, 20, shape)).astype(np.int32)
    lo, hi = dtypes.integer_range(name)
    a = rng.integers(lo, hi, shape, endpoint=True).astype(dtypes.by_name(name).numpy)
    if high_bits and a.dtype.itemsize == 1 and name in ("int4", "uint4"):
        a.view(np.uint8)[...] |= (rng.integers(0, 16, shape) << 4).astype(np.uint8)
    return a


@st.composite
def long_forms(draw):
    """Forms whose rows reach the fused loops: groups of 1 to 140 along the last axis (tables, for
    4-bit src, from 16 on) and along axis 0 (parameters at every element, rows sharing them),
    per channel, a parameter per element, per tensor; every src, T2 and zero-point kind; cut
    anywhere, streamed or not, into an output starting anywhere in a 64-byte line."""
    t1 = draw(st.sampled_from(["int4", "uint4", "int8", "uint8"]))
    t2 = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    t3 = draw(st.sampled_from([None, "int8", "uint8", "int4", "uint4", "int32", "wide"]))
    form = draw(st.sampled_from(["last", "axis 0", "channel last", "every element", "tensor"]))
    g, count, other = draw(st.integers(1, 140)), draw(st.integers(1, 3)), draw(st.integers(1, 200))
    if form == "last":
        shape, qtype, axis, groups, pshape = (other, count * g), "per_group", 1, [1, g], (other, count)
    elif form == "axis 0":
        shape, qtype, axis, groups, pshape = (count * g, other), "per_group", 1, [g, 1], (count, other)
    elif form == "channel last":  # every row the same parameters
        shape, qtype, axis, groups, pshape = (count, other), "per_channel", 1, None, (other,)
    elif form == "every element":  # no two rows the same parameters
        shape, qtype, axis, groups, pshape = (count, other), "per_group", 1, [1, 1], (count, other)
    else:
        shape, qtype, axis, groups, pshape = (count, other), "per_tensor", 1, None, (1,)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    src = _ints(rng, t1, shape, high_bits=draw(st.booleans()))
    scales = _scales(rng, t2, pshape)
    zps = None if t3 is None else _ints(rng, t3, pshape, high_bits=draw(st.booleans()))
    n = src.size
    cuts = sorted({0, n, *rng.integers(0, n + 1, draw(st.integers(0, 4))).tolist()})
    return src, scales, zps, shape, qtype, axis, groups, cuts, draw(st.booleans()), draw(st.integers(0, 31))


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=long_forms())
def test_long_rows_any_cut_any_alignment_match_the_oracle(level, form):
    src, scales, zps, shape, qtype, axis, groups, cuts, stream, offset = form
    expect = oracle_2(src, scales, zps, qtype, axis, groups)
    t2 = np.dtype(scales.dtype)
    out = np.zeros(src.size + offset, t2)[offset:].reshape(shape)  # any start within a line
    with at(level):
        got = cut_run(src, scales, zps, shape, qtype, axis, groups, out, cuts, stream)
    assert same_bits(got, expect)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("t2", ["float16", "bfloat16"])
@pytest.mark.parametrize("groups", [[64, 1], [1, 64]])  # a scale at every element of a row, or a table each
def test_every_16_bit_scale_pattern(level, t2, groups):
    """Every float16 / bfloat16 pattern as a scale (the fused loop widens them in-register), times
    every 4-bit value and a zero point."""
    scales = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtypes.by_name(t2).numpy)
    scales = scales.reshape(256, 256) if groups == [64, 1] else scales.reshape(-1, 8)
    shape = tuple(p * g for p, g in zip(scales.shape, groups))
    src = np.resize(np.arange(16, dtype=np.uint8), shape).view(ml_dtypes.int4)
    zps = np.full(scales.shape, 3, np.int8)
    expect = oracle_2(src, scales, zps, "per_group", 1, groups)
    with at(level):
        got = cut_run(src, scales, zps, shape, "per_group", 1, groups, np.zeros(shape, scales.dtype),
                      [0, src.size], False)
    assert same_bits(got, expect)


def test_levels_are_set_and_restored():
    top = native.cpu_level()
    assert native.level() == top
    with native.at_level(0):
        assert native.level() == 0
    assert native.level() == top
    with pytest.raises(ValueError, match="this CPU has levels 0 to"):
        native.at_level(top + 1).__enter__()
    assert native.level() == top


def test_an_output_off_its_element_alignment_gets_the_numpy_kernels_bits():
    src = np.arange(256, dtype=np.uint8).view(ml_dtypes.uint4).reshape(8, 32)
    scales = np.linspace(-3, 3, 8 * 2).astype(np.float16).reshape(8, 2)
    buf = np.zeros(src.size * 2 + 1, np.uint8)
    out = np.frombuffer(buf.data, np.float16, src.size, offset=1).reshape(src.shape)  # not 2-byte aligned
    assert not out.flags.aligned
    with tuned(native=True):
        got = dyndq.dynamic_dequantize(src, scales, qtype="per_group", group_shape=[1, 16], out=out)
    assert got is out and same_bits(out, oracle_2(src, scales, None, "per_group", 1, [1, 16]))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("stream", [False, True])
def test_rows_longer_than_the_row_cache(level, stream):
    """Rows sharing their parameters are read from a row widened once, up to 65536 elements
    (ROW_CACHE in _native.c); longer ones from the parameters as given."""
    rng = np.random.default_rng(5)
    for length in (65536, 65537):
        src = rng.integers(-8, 8, (3, length)).astype(ml_dtypes.int4)
        scales = _scales(rng, "bfloat16", (length,))
        zps = _ints(rng, "uint4", (length,), high_bits=True)
        expect = oracle_2(src, scales, zps, "per_channel", 1, None)
        with at(level):
            got = cut_run(src, scales, zps, src.shape, "per_channel", 1, None, np.zeros(src.shape, scales.dtype),
                          [0, 5, length + 3, src.size], stream)
        assert same_bits(got, expect)


@pytest.mark.parametrize("level", LEVELS)
def test_per_element_parameters_as_given_at_any_level(level):
    """The C side takes per-element float16 scales and 4-bit zero points as given at every level
    (native.py widens them first for level 0 only; the plain loop widens a block at a time)."""
    rng = np.random.default_rng(6)
    src = rng.integers(0, 16, (64, 300)).astype(ml_dtypes.uint4)
    scales = _scales(rng, "float16", (2, 300))
    zps = _ints(rng, "int4", (2, 300), high_bits=True)
    vshape, varies = view(src.shape, "per_group", 1, [32, 1])
    out = np.zeros(src.shape, np.float16)
    b = native._bytes
    with at(level):
        native._native.dequantize(b(src), b(out), b(scales), b(zps), vshape, varies, native._SRC[src.dtype],
                                  native._DST[out.dtype], native._ZMODE["narrow"], 0, src.size, False,
                                  native._SCALE_KIND[scales.dtype], native._ZP_KIND[zps.dtype])
    assert same_bits(out, oracle_2(src, scales, zps, "per_group", 1, [32, 1]))


# -- the one dispatcher: what runs is what info() says, and DYNDQ_CPU_LEVEL picks it --------------


def _info_in_subprocess(**env_changes) -> dict:
    env = dict(os.environ, **env_changes)
    code = "import json; from dyndq.kernels import native; print(json.dumps(native.info()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    import json

    return json.loads(out.stdout.strip().splitlines()[-1]) | {"stderr": out.stderr}


def test_info_reads_the_table_the_calls_go_through():
    i = native.info()
    assert (i["built"], i["on"], i["kernel"]) == (True, True, "compiled")
    assert i["level"] == i["cpu_level"] and i["variants"][: i["cpu_level"] + 1] == tuple(VARIANT[: i["cpu_level"] + 1])
    for level in range(native.cpu_level() + 1):
        with native.at_level(level):
            assert native.info()["entries"] == dict.fromkeys(("dequantize", "widen", "narrow"), VARIANT[level])
    assert native.info()["level"] == i["level"]
    assert "compiled" in native.summary() and VARIANT[i["level"]] in native.summary()


@pytest.mark.parametrize("level", LEVELS)
def test_the_environment_chooses_the_level_at_import(level):
    i = _info_in_subprocess(DYNDQ_CPU_LEVEL=str(level))
    assert i["level"] == level and i["entries"]["dequantize"] == VARIANT[level]


def test_a_level_the_cpu_lacks_in_the_environment_is_refused_with_a_warning():
    i = _info_in_subprocess(DYNDQ_CPU_LEVEL="7")
    assert i["level"] == native.cpu_level() and "DYNDQ_CPU_LEVEL='7': this CPU has levels 0 to" in i["stderr"]


def test_a_module_that_does_not_load_leaves_the_numpy_kernel_saying_why(tmp_path):
    i = _info_in_subprocess(DYNDQ_NATIVE_MODULE=str(tmp_path / "missing.so"))
    assert (i["built"], i["kernel"]) == (False, "numpy") and i["why"].startswith("not loadable (")


def test_kind_codes_come_from_the_c_side():
    """The dtype -> code tables native.py passes are the C module's own, by name."""
    assert {d.name for d in native._SRC} == set(native._native.KINDS["src"]) == {
        "int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32", "float8_e4m3fn",
        "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"}
    for table, codes in (("src", native._SRC), ("dst", native._DST), ("scale", native._SCALE_KIND),
                         ("zp", native._ZP_KIND), ("widen", native._WIDEN)):
        assert {d.name: c for d, c in codes.items()} == native._native.KINDS[table]


def test_sizes_that_overflow_are_refused():
    src = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match="the size overflows"):
        native._native.dequantize(src, np.zeros(4, np.float32), np.ones(1, np.float32), None, (2**40, 2**40),
                                  (False, False), 1, 0, 0, 0, 4, False, 0, 0)


@pytest.mark.parametrize("groups", [[32, 32], [32, 1], [1, 1]])  # runs of a group; a parameter per element
def test_parameters_at_odd_addresses_are_read_exactly(groups):
    """Scales and zero points need not be aligned (NumPy arrays need not be): read through memcpy."""
    rng = np.random.default_rng(9)
    src = rng.integers(-128, 128, (64, 96), dtype=np.int8)
    pshape = (64 // groups[0], 96 // groups[1])
    n = pshape[0] * pshape[1]
    scales = np.ndarray(pshape, np.float32, np.zeros(4 * n + 1, np.uint8), offset=1)  # not 4-byte aligned
    scales[...] = rng.standard_normal(pshape)
    zps = np.ndarray(pshape, np.int32, np.zeros(4 * n + 3, np.uint8), offset=3)
    zps[...] = rng.integers(-5, 5, pshape)
    assert not scales.flags.aligned and not zps.flags.aligned
    for level in range(native.cpu_level() + 1):
        with at(level):
            got = cut_run(src, scales, zps, src.shape, "per_group", 1, groups, np.zeros(src.shape, np.float32),
                          [0, 100, src.size], False)
        assert same_bits(got, oracle_2(src, scales, zps, "per_group", 1, groups))


def test_an_output_off_its_alignment_is_refused_by_the_c_side():
    buf = np.zeros(4 * 8 + 1, np.uint8)
    with pytest.raises(ValueError, match="not aligned"):
        native._native.dequantize(np.zeros(8, np.uint8), buf[1:], np.ones(1, np.float32), None, (8,), (False,),
                                  1, 0, 0, 0, 8, False, 0, 0)


def _pytest_in_subprocess(env_changes, *args):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("DYNDQ_REQUIRE_NATIVE", "DYNDQ_NATIVE")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)


def test_without_the_compiled_kernel_its_tests_are_left_out_in_one_line(tmp_path):
    p = _pytest_in_subprocess({"DYNDQ_NATIVE_MODULE": str(tmp_path / "missing.so")}, "tests/kernels/test_native.py",
                              "tests/opdefs/test_registry.py")
    assert p.returncode == 0, p.stdout[-2000:]
    lines = [line for line in p.stdout.splitlines() if "compiled-kernel tests" in line]
    assert len(lines) == 1 and lines[0].startswith("compiled-kernel tests: ") and "not loadable" in lines[0], lines


def test_required_and_missing_the_run_fails(tmp_path):
    p = _pytest_in_subprocess({"DYNDQ_NATIVE_MODULE": str(tmp_path / "missing.so"), "DYNDQ_REQUIRE_NATIVE": "1"},
                              "tests/opdefs/test_registry.py")
    assert p.returncode == 1 and "DYNDQ_REQUIRE_NATIVE=1, but the compiled kernel is not loadable" in p.stdout + p.stderr
