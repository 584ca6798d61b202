"""The compiled kernel's own parts (kernels/_native.c, kernels/native.py): its roundings on every
rounding boundary, its work cut at any element, its switch.  Its results as a whole are
judged against the oracle by every test of test_dynamic_dequantize*.py, which run on
both kernels."""
from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import dyndq
from dyndq.kernels import native
from dyndq.kernels.dequantize_v2 import view
from dyndq.kernels.parallel import NATIVE_ENV, switched_off, tuned

from cases import oracle_2, same_bits

if not native.built() and switched_off(NATIVE_ENV):
    pytest.skip(f"{NATIVE_ENV}=0 and the compiled kernel not built: the NumPy kernel alone", allow_module_level=True)


def test_it_was_built():
    assert native.built(), ("kernels/_native.c was not built (is there a C compiler? `pip install -e .` says why); "
                            "set DYNDQ_NATIVE=0 to test the NumPy kernel alone")


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


LEVELS = [pytest.param(k, id=name, marks=pytest.mark.skipif(native.built() and k > native.cpu_level(),
                                                             reason=f"this CPU has no {name}"))
          for k, name in enumerate(["plain-C", "AVX2-F16C", "AVX-512"])]


@pytest.mark.parametrize("level", LEVELS)
def test_float16_rounding_on_every_boundary(level):
    p = boundary_patterns(13)
    with np.errstate(all="ignore"):
        want = p.astype(np.float16)
    want.view(np.uint16)[np.isnan(p)] = 0x7E00  # NaNs: the one quiet NaN (kernels/narrowing.py)
    assert same_bits(native.narrow(p, np.float16, level=level), want)


@pytest.mark.parametrize("level", LEVELS)
def test_bfloat16_rounding_on_every_boundary(level):
    p = boundary_patterns(16)
    with np.errstate(all="ignore"):
        want = p.astype(ml_dtypes.bfloat16)  # NaNs: 0x7FC0 with the sign, as ml_dtypes makes them
    assert same_bits(native.narrow(p, ml_dtypes.bfloat16, level=level), want)


FORMS = [  # shape, qtype, axis, group_shape
    ((6, 64), "per_group", 1, [1, 32]),
    ((64, 6), "per_group", 0, [32, 1]),
    ((4, 6, 8), "per_group", 2, [2, 3, 4]),
    ((5, 7, 9), "per_channel", 1, None),
    ((5, 7), "per_channel", -1, None),
    ((300,), "per_tensor", 0, None),
]


@pytest.mark.parametrize("shape,qtype,axis,group_shape", FORMS)
@pytest.mark.parametrize("t2", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("zp", [None, "uint8", "wide"])
@pytest.mark.parametrize("stream", [False, True])
def test_any_cut_of_the_elements_gives_the_whole(shape, qtype, axis, group_shape, t2, zp, stream):
    """The C loop starts and stops anywhere: mid-row, mid-group (as threads cut it)."""
    rng = np.random.default_rng(len(shape))
    src = rng.integers(-8, 8, shape).astype(ml_dtypes.int4)
    pshape = ([1] if qtype == "per_tensor" else [shape[axis]] if qtype == "per_channel"
              else [d // g for d, g in zip(shape, group_shape)])
    scales = rng.standard_normal(pshape).astype(t2)
    zps = None if zp is None else (rng.integers(0, 256, pshape).astype(np.uint8) if zp == "uint8"
                                   else np.full(pshape, 2**31 - 1, np.int32))  # src - zp overflows int32
    vshape, varies = view(shape, qtype, axis, group_shape)
    expect = oracle_2(src, scales, zps, qtype, axis, group_shape)
    n = src.size
    cuts = sorted({0, n, *rng.integers(0, n, 7).tolist()})
    out = np.zeros(shape, t2)
    o = out.view(np.uint16) if out.dtype.itemsize == 2 else out
    widen = varies[-1]  # as kernels/native.py passes them: as given, unless they change at every element
    z, zmode, zk = (None, 0, 0) if zps is None else native._zero_points(zps, int(np.prod(pshape)), widen)
    sc, sk = native._params(scales, native._SCALE_KIND, np.dtype(np.float32), widen)
    z = None if z is None else native._bytes(z)
    for a, b in zip(cuts, cuts[1:]):
        native._native.dequantize(src.view(np.uint8), o, native._bytes(sc), z, vshape, varies,
                                  native._SRC[src.dtype], native._DST[out.dtype], zmode, a, b, stream, sk, zk)
    assert same_bits(out, expect)


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
        native.narrow(np.zeros(4, np.float32), np.float16, level=native.cpu_level() + 1)


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
