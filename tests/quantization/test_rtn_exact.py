"""method="rtn" gives ONNX Runtime's own codes, scales and zero points, for every weight.

ONNX Runtime's MatMulNBitsQuantizer (default configuration) quantizes MatMul's B with its C++
MlasQuantizeBlockwise (the Python binding quantize_matmul_4bits / _8bits) and Gather's data with
NumPy (DefaultWeightOnlyQuantizer.quantize_ndarray).  Both are run here on the same weights
as ours, over dtypes, shapes, block sizes, signs and ties (hypothesis), and the whole
quantizer on a model: the results must be equal, bit for bit.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import numpy_helper as nh

import dyndq
from dyndq.quantization.numerics import quantize_weight

ort_quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # (needs onnx_ir: in the test extra)
from onnxruntime.capi._pybind_state import (  # noqa: E402
    quantize_matmul_2bits, quantize_matmul_4bits, quantize_matmul_8bits)

from quantize_models import extreme_weights, heavy, mlp  # noqa: E402


def ort_matmul(w: np.ndarray, bits: int, block: int, symmetric: bool):
    """ONNX Runtime's (codes [K, N] as levels 0..2^bits-1, scales [blocks, N], zero points [blocks, N]),
    from the MatMulNBits layout its binding writes (B transposed, blocks padded, lowest bits first)."""
    k, n = w.shape
    blocks = -(-k // block)
    per_byte = 8 // bits
    padded = np.zeros((blocks * block, n), w.dtype)
    padded[:k] = w  # (its Python side pads K to whole blocks with zeros, and passes the real K)
    packed = np.zeros((n, blocks, block // per_byte), np.uint8)
    zps = np.zeros((n, -(-blocks // per_byte)), np.uint8)
    scales = np.zeros((n, blocks), w.dtype)
    binding = {2: quantize_matmul_2bits, 4: quantize_matmul_4bits, 8: quantize_matmul_8bits}[bits]
    binding(packed, padded, scales, zps, block, n, k, symmetric)
    codes, zps = unpacked(packed, bits).reshape(n, -1), unpacked(zps, bits).reshape(n, -1)[:, :blocks]
    return codes.T[:k], scales.T, zps.T


def unpacked(packed: np.ndarray, bits: int) -> np.ndarray:
    """Bytes of 8 / bits codes each, lowest bits first (MatMulNBits' packing), as one code per byte."""
    mask = (1 << bits) - 1
    return np.stack([(packed >> shift) & mask for shift in range(0, 8, bits)], axis=-1).reshape(*packed.shape[:-1], -1)


def bits_of(a: np.ndarray) -> np.ndarray:
    """A float array's bit patterns (equal floats, -0 told from 0)."""
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def ours_as_levels(q, bits, symmetric):
    """Our codes as ONNX Runtime's unsigned levels (a symmetric code c is level c + 2^(bits-1))."""
    codes = q.codes.astype(np.int16)
    return codes + (1 << (bits - 1)) if symmetric else codes


weights = st.tuples(
    st.integers(1, 300), st.integers(1, 24), st.integers(0, 2**31 - 1),
    st.sampled_from(["t3", "t5", "positive", "negative", "ties", "zero-block", "constant", "signed-zeros"]),
    st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]),
)


def make_weight(k, n, seed, kind, dtype, block):
    rng = np.random.default_rng(seed)
    w = rng.standard_t(3 if kind == "t3" else 5, size=(k, n)) * 0.02
    if kind == "positive":
        w = np.abs(w)
    elif kind == "negative":
        w = -np.abs(w)
    elif kind == "ties":  # values on a coarse grid: many land on .5 exactly
        w = np.round(w * 64) / 64
    elif kind == "zero-block":
        w[: min(k, block)] = 0
    elif kind == "constant":
        w[:] = w[0, 0]
    elif kind == "signed-zeros":  # groups of 0 and -0 only (the sign of a zero scale), and a few values
        w = rng.choice(np.array([0.0, -0.0, 0.02, -0.03]), size=(k, n), p=[0.45, 0.45, 0.05, 0.05])
    return w.astype(dtype)


@settings(max_examples=300, deadline=None)
@given(weights, st.sampled_from([2, 4, 8]), st.booleans(), st.sampled_from([16, 32, 64, 128, 256]))
def test_matmul_rule_equals_onnxruntime(weight, bits, symmetric, block):
    k, n, seed, kind, dtype = weight
    w = make_weight(k, n, seed, kind, dtype, block)
    if dtype == ml_dtypes.bfloat16:  # (what its Python side does: the binding takes no bfloat16)
        codes, scales, zps = ort_matmul(w.astype(np.float32), bits, block, symmetric)
        scales = scales.astype(dtype)
    else:
        codes, scales, zps = ort_matmul(w, bits, block, symmetric)
    q = quantize_weight(w, axis=0, group_size=block, bits=bits, symmetric=symmetric)
    np.testing.assert_array_equal(ours_as_levels(q, bits, symmetric)[:k], codes)
    np.testing.assert_array_equal(bits_of(q.scales), bits_of(scales))
    if not symmetric:
        np.testing.assert_array_equal(q.zero_points.astype(np.uint8), zps)


def as_its_dequantization_gives(levels, zero_points, scales, block, dtype):
    """float32(level - zero point) * float32(scale), rounded to `dtype`: ONNX Runtime's weight
    (its MatMulNBits and DequantizeLinear compute it so), [K, N] from [blocks, N] parameters."""
    k = levels.shape[0]
    zero_points = np.repeat(zero_points.astype(np.int16), block, axis=0)[:k]
    scales = np.repeat(scales.astype(np.float32), block, axis=0)[:k]
    with np.errstate(over="ignore", invalid="ignore"):
        return ((levels.astype(np.int16) - zero_points).astype(np.float32) * scales).astype(dtype)


def finite(a) -> bool:
    return bool(np.isfinite(np.asarray(a).astype(np.float32)).all())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (its NumPy code's, on overflowing groups)
@settings(max_examples=300, deadline=None)
@given(extreme_weights(max_rows=80), st.sampled_from([4, 8]), st.booleans(), st.sampled_from([16, 32]),
       st.sampled_from(["matmul", "gather"]))
def test_extreme_weights_equal_onnxruntime_wherever_it_stays_finite(w, bits, symmetric, block, rule):
    """Where ONNX Runtime's scales and the weight they give back are finite, ours are its codes,
    scales and zero points; elsewhere (its scale or weight infinite or NaN) ours are finite."""
    k, n = w.shape
    if rule == "gather":
        bits, table = 4, w.T.copy()  # (its NumPy rule: 4 bits, along the table's last axis)
        block = min(block, k)
        packed, scales, zps = ort_quant.DefaultWeightOnlyQuantizer.quantize_ndarray(table, 1, block, symmetric)
        codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(-1)[: table.size].reshape(n, k).T
        levels = codes.astype(np.int16) + 8 * symmetric - 16 * (symmetric & (codes >= 8))  # (signed nibbles)
        scales = scales.T
        zps = np.full(scales.shape, 8) if symmetric else \
            np.stack([zps & 15, zps >> 4], axis=-1).reshape(-1)[: scales.size].reshape(n, -1).T
    else:
        single = w.astype(np.float32) if w.dtype == ml_dtypes.bfloat16 else w
        levels, scales, zps = ort_matmul(single, bits, block, symmetric)
        scales = scales.astype(w.dtype)
        if symmetric:
            zps = np.full(scales.shape, 1 << (bits - 1))
    theirs = as_its_dequantization_gives(levels, zps, scales, block, w.dtype)
    q = quantize_weight(w, axis=0, group_size=block, bits=bits, symmetric=symmetric, rule=rule)
    if not (finite(scales) and finite(theirs)):
        assert finite(q.scales) and np.isfinite(q.stats.relative)
        return
    np.testing.assert_array_equal(ours_as_levels(q, bits, symmetric)[:k], levels)
    np.testing.assert_array_equal(bits_of(q.scales), bits_of(scales))
    if not symmetric:
        np.testing.assert_array_equal(q.zero_points.astype(np.uint8), zps)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (its NumPy code's, on all-zero groups)
@settings(max_examples=200, deadline=None)
@given(weights, st.booleans(), st.sampled_from([16, 32, 64, 128]))
def test_gather_rule_equals_onnxruntime(weight, symmetric, block):
    k, n, seed, kind, dtype = weight
    table = make_weight(k, n, seed, kind, dtype, block).T.copy()  # [vocabulary, hidden], blocks along hidden
    packed, scales, zps = ort_quant.DefaultWeightOnlyQuantizer.quantize_ndarray(table, 1, block, symmetric)
    q = quantize_weight(table, axis=1, group_size=block, bits=4, symmetric=symmetric, rule="gather")
    n_codes = table.size
    flat = np.stack([packed & 15, packed >> 4], axis=-1).reshape(-1)[:n_codes].reshape(table.shape)
    ours = q.codes.view(np.uint8)[:, : table.shape[1]]  # (the nibble of each code, as packed)
    np.testing.assert_array_equal(ours, flat)
    np.testing.assert_array_equal(bits_of(q.scales), bits_of(scales))
    if not symmetric:
        zflat = np.stack([zps & 15, zps >> 4], axis=-1).reshape(-1)[: scales.size].reshape(scales.shape)
        np.testing.assert_array_equal(q.zero_points.view(np.uint8), zflat)


def _initializers(model):
    return {t.name: nh.to_array(t) for t in model.graph.initializer}


def _ort_quantized(model, op_types=("MatMul", "Gather"), **kw):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # (it changes the model it is given)
    if op_types is not None:
        kw["op_types_to_quantize"] = op_types
    quantizer = ort_quant.MatMulNBitsQuantizer(copy, **kw)
    quantizer.process()
    return quantizer.model.model


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("bits,symmetric,block,dtype", [
    (4, False, 128, np.float32), (4, True, 32, np.float32), (4, False, 16, np.float16), (4, True, 64, ml_dtypes.bfloat16),
    (4, False, 32, ml_dtypes.bfloat16), (8, False, 64, np.float32), (8, True, 128, np.float16),
    (2, False, 32, np.float32), (2, True, 64, np.float32), (2, False, 128, np.float16), (2, True, 16, ml_dtypes.bfloat16)])
@pytest.mark.parametrize("k", [256, 200])
def test_whole_quantizer_equals_onnxruntime_default_configuration(bits, symmetric, block, dtype, k):
    """MatMulNBitsQuantizer (its default algorithm and format, MatMul and Gather) on a model;
    dyndq.quantize(method="rtn") on the same: the same codes, scales and zero points.
    (At 2 bits it quantizes MatMul alone, refusing Gather: there ours is checked by the rule test.)"""
    model = mlp(k=k, n=96, dtype=dtype)
    ort_model = _ort_quantized(model, bits=bits, block_size=block, is_symmetric=symmetric)
    theirs = _initializers(ort_model)
    ours_model, report = dyndq.quantize(model, bits=bits, group_size=block, symmetric=symmetric, ops=("MatMul", "Gather"),
                                        evaluate=False)
    ours = _initializers(ours_model)
    # MatMul: MatMulNBits' B [N, blocks, bytes], scales [N * blocks], zero points packed per column
    w1 = nh.to_array(model.graph.initializer[1])
    codes, scales, zps = ort_matmul(w1.astype(np.float32) if dtype == ml_dtypes.bfloat16 else w1, bits, block, symmetric)
    packed = theirs["W1_Q%d" % bits]
    assert packed.shape == (96, -(-k // block), block * bits // 8)
    np.testing.assert_array_equal(ours_as_levels(_q(ours, "W1"), bits, symmetric)[:k], codes)
    np.testing.assert_array_equal(bits_of(ours["W1_scales"]), bits_of(theirs["W1_scales"].reshape(96, -1).T))
    np.testing.assert_array_equal(bits_of(ours["W1_scales"]), bits_of(scales.astype(dtype)))
    if not symmetric:
        np.testing.assert_array_equal(ours["W1_zero_points"].astype(np.uint8), zps)
    # and the bytes of B itself: our codes packed its way are its B
    levels = ours_as_levels(_q(ours, "W1"), bits, symmetric).astype(np.uint8).T  # [N, padded K]
    mine = levels.reshape(96, -1, block // (8 // bits), 8 // bits) << np.arange(0, 8, bits, dtype=np.uint8)
    np.testing.assert_array_equal(np.bitwise_or.reduce(mine, axis=-1), packed)
    if bits == 4:  # Gather: GatherBlockQuantized's data, scales and zero points, as standard int4 tensors
        codes = ours["E_quantized"][:, :k]  # (ours padded to whole groups when they do not divide k)
        np.testing.assert_array_equal(codes, theirs["E_Q4"])
        np.testing.assert_array_equal(bits_of(ours["E_scales"]), bits_of(theirs["E_scales"]))
        if not symmetric:
            np.testing.assert_array_equal(ours["E_zero_points"], theirs["E_zero_points"])
    assert {layer.name for layer in report.layers} == {"E", "W1"}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("k", [1, 7, 31, 32, 100, 127, 128, 129, 200, 256, 300])
@pytest.mark.parametrize("config", ["default", "gather", "symmetric", "8 bits"])
def test_every_weight_onnxruntime_quantizes_is_quantized_alike_in_every_size(k, config):
    """ONNX Runtime's quantizer in its default configuration (4 bits, blocks of 128, asymmetric,
    MatMul only), with Gather added, symmetric, and at 8 bits: every weight it quantizes, ours
    quantizes too, with its codes, scales and zero points, value for value, and the bytes of
    MatMulNBits' B, padding and all (a K shorter than a block is one block), but the nibble
    after an odd K; K from 1 to past two blocks."""
    model = mlp(k=k, n=24, vocab=40, seed=k)
    kw = {"default": {}, "gather": dict(op_types=("MatMul", "Gather")), "symmetric": dict(is_symmetric=True),
          "8 bits": dict(bits=8)}[config]
    theirs = _initializers(_ort_quantized(model, **{"op_types": None, **kw}))
    bits, symmetric = kw.get("bits", 4), kw.get("is_symmetric", False)
    ours_model, report = dyndq.quantize(model, bits=bits, symmetric=symmetric, evaluate=False)  # (groups of 128)
    ours = _initializers(ours_model)
    taken = {n.rsplit("_Q", 1)[0] for n in theirs if n.endswith(f"_Q{bits}")}
    assert taken == ({"W1", "E"} if config == "gather" else {"W1"})
    assert taken <= {layer.name for layer in report.layers} and not report.left_alone
    blocks = -(-k // 128)
    levels = ours_as_levels(_q(ours, "W1"), bits, symmetric).astype(np.uint8).T  # [N, padded K]
    assert levels.shape == (24, blocks * 128)
    packed = theirs[f"W1_Q{bits}"]
    assert packed.shape == (24, blocks, 128 * bits // 8)
    if bits == 4:
        mine = levels.reshape(24, blocks, 128)
        mine = (mine[..., 0::2] | (mine[..., 1::2] << 4)).reshape(24, -1)
        packed = packed.reshape(24, -1)
        # the byte holding an odd K's last code holds in its high nibble no value of the weight
        # (MlasQuantizeBlockwise's varies from column to column, ours is 0): its low nibble compared
        whole = k // 2
        np.testing.assert_array_equal(mine[:, :whole], packed[:, :whole])
        if k % 2:
            np.testing.assert_array_equal(mine[:, whole] & 15, packed[:, whole] & 15)
        np.testing.assert_array_equal(mine[:, -(-k // 2):], packed[:, -(-k // 2):])  # (then zeros, both)
    else:
        np.testing.assert_array_equal(levels.reshape(24, blocks, 128), packed)
    # (one block per whole axis is our per_channel form: scales [N])
    np.testing.assert_array_equal(bits_of(ours["W1_scales"].reshape(blocks, 24)), bits_of(theirs["W1_scales"].reshape(24, -1).T))
    if not symmetric:
        zps = theirs["W1_zero_points"]
        if bits == 4:
            zps = np.stack([zps & 15, zps >> 4], axis=-1)
        zps = zps.reshape(24, -1)[:, :blocks].T
        np.testing.assert_array_equal(ours["W1_zero_points"].view(np.uint8).reshape(blocks, 24), zps)
    if "E" in taken:  # GatherBlockQuantized's data [vocabulary, hidden], blocks along hidden
        np.testing.assert_array_equal(ours["E_quantized"][:, :k], theirs["E_Q4"])
        np.testing.assert_array_equal(bits_of(ours["E_scales"].reshape(40, -1)), bits_of(theirs["E_scales"]))
        np.testing.assert_array_equal(ours["E_zero_points"].reshape(40, -1), theirs["E_zero_points"])


def _q(initializers, name):
    class Q:
        codes = initializers[f"{name}_quantized"]
    return Q


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")  # (its torch code's)
def test_search_is_no_worse_than_onnxruntime_hqq():
    """ONNX Runtime's HQQ (same settings: 4 bits, groups of 128, asymmetric; MatMul) against
    dyndq's search, on the same heavy-tailed weights: the relative Frobenius error of the
    weights each gives back.  HQQ needs torch, which the test extra does not install (a CPU
    build is hundreds of MB): without it this test is skipped, and benchmarks/bench_quantize.py
    (run with torch) reports the same comparison."""
    pytest.importorskip("torch")
    model = mlp(k=512, n=256, seed=11)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    config = ort_quant.HQQWeightOnlyQuantConfig(block_size=128, bits=4, op_types_to_quantize=("MatMul",))
    quantizer = ort_quant.MatMulNBitsQuantizer(copy, algo_config=config)
    quantizer.process()
    theirs = {t.name: nh.to_array(t) for t in quantizer.model.model.graph.initializer}
    node = next(n for n in quantizer.model.model.graph.node if n.op_type == "MatMulNBits")
    packed, scales, zps = (theirs[name] for name in node.input[1:4])
    w = nh.to_array(model.graph.initializer[1])  # W1 [512, 256]
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(256, -1).astype(np.float32)
    zps, scales = zps.reshape(256, -1).astype(np.float32), scales.reshape(256, -1).astype(np.float32)
    hqq = ((codes - np.repeat(zps, 128, axis=1)) * np.repeat(scales, 128, axis=1)).T
    hqq_error = np.linalg.norm(w - hqq) / np.linalg.norm(w)
    _, report = dyndq.quantize(model, method="search", ops=("MatMul",), evaluate=False)
    assert report.layers[0].name == "W1"
    assert report.layers[0].relative_error <= hqq_error


@pytest.mark.parametrize("k", [7, 100, 200])
def test_a_weight_with_leading_ones_is_quantized_as_onnxruntime_squeezes_it(k):
    """ONNX Runtime's quantizer takes a MatMul weight [1, 1, K, N] as [K, N]; ours groups it along
    K the same way, with its codes, scales and zero points."""
    w = heavy((1, 1, k, 24), seed=k)
    g = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                               [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 3, k])],
                               [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 3, 24])],
                               [nh.from_array(w, "W")])
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    theirs = _initializers(_ort_quantized(model, op_types=None))
    ours = _initializers(dyndq.quantize(model, evaluate=False)[0])
    codes, scales, zps = ort_matmul(w.reshape(k, 24), 4, 128, False)
    np.testing.assert_array_equal(ours["W_quantized"].view(np.uint8).reshape(-1, 24)[:k], codes)
    np.testing.assert_array_equal(bits_of(ours["W_scales"].reshape(-1, 24)), bits_of(theirs["W_scales"].reshape(24, -1).T))
    np.testing.assert_array_equal(bits_of(ours["W_scales"].reshape(-1, 24)), bits_of(scales))
    np.testing.assert_array_equal(ours["W_zero_points"].view(np.uint8).reshape(-1, 24), zps)
