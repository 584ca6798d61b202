"""2-bit codes, MXFP4 and NVFP4: the rules of docs/quantize.md against implementations written
here from the rules' words (nearest values found by enumerating each type's values, quotients
as exact fractions), against torchao's reference functions where torch and torchao are
installed, and the quantized models run on every engine with the same bits."""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as T, helper, numpy_helper as nh
from onnx.reference import ReferenceEvaluator

import dyndq
from dyndq.quantization import OptionError
from dyndq.quantization.fp4 import quantize_fp4
from engines import needs_openvino, run_onnxruntime, run_openvino
from quantize_models import FLOAT_DTYPES, extreme_weights, heavy

# float4e2m1's magnitudes by code (0..7): code parity is significand parity
FP4 = [Fraction(v) for v in ("0", "0.5", "1", "1.5", "2", "3", "4", "6")]
# float8e4m3fn's finite magnitudes by code (0..126; 127 is NaN)
E4M3 = [Fraction(float(v)) for v in np.arange(127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)]


def nearest_even(y: Fraction, table: list[Fraction], negative: bool) -> float:
    """The value of `table` (magnitudes by code) nearest |y|, ties to the even code; beyond the
    table's largest, the largest (saturating); with the sign of the value rounded (`negative`:
    a negative value that rounds to 0 is -0, as IEEE rounding gives)."""
    a = abs(y)
    best = min(range(len(table)), key=lambda c: (abs(table[c] - a), c % 2))
    return math.copysign(float(table[best]), -1.0 if negative else 1.0)


def mx_rule(w: np.ndarray):
    """MXFP4 of a [K, N] weight along K, from the rule's words: (codes as floats [K', N], scales [blocks, N])."""
    k, n = w.shape
    blocks = -(-k // 32)
    codes = np.zeros((blocks * 32, n))
    scales = np.zeros((blocks, n))
    for b in range(blocks):
        for j in range(n):
            column = w[b * 32:(b + 1) * 32, j].astype(np.float64)
            x, signs = [Fraction(float(v)) for v in column], np.signbit(column)
            top = max(abs(v) for v in x)
            if top == 0:
                e = -127  # (an all-zero block: the smallest scale, codes 0)
            else:
                e = math.floor(math.log2(float(top)))  # (then made exact: 2^e <= top < 2^(e+1))
                while Fraction(2) ** e > top:
                    e -= 1
                while Fraction(2) ** (e + 1) <= top:
                    e += 1
                e = min(max(e - 2, -127), 127)
            scales[b, j] = 2.0 ** e
            for i, v in enumerate(x):
                codes[b * 32 + i, j] = nearest_even(v / Fraction(2) ** e, FP4, signs[i])
    return codes, scales


def nv_rule(w: np.ndarray):
    """NVFP4 of a [K, N] weight along K, from the rule's words: (codes, block scales, g)."""
    f32 = np.float32
    k, n = w.shape
    blocks = -(-k // 16)
    g = f32(np.abs(w.astype(f32)).max()) / f32(448 * 6)
    codes = np.zeros((blocks * 16, n))
    scales = np.zeros((blocks, n))
    for b in range(blocks):
        for j in range(n):
            x = w[b * 16:(b + 1) * 16, j].astype(f32)
            s = nearest_even(Fraction(float((np.abs(x).max() / f32(6)) / g)), E4M3, False) if g else 0.0
            scales[b, j] = s
            d = Fraction(float(f32(s) * g))
            for i, v in enumerate(x):
                codes[b * 16 + i, j] = nearest_even(Fraction(float(v)) / d, FP4, np.signbit(v)) if d else 0.0
    return codes, scales, g


def as_floats(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def same(a, b) -> None:
    """Equal values, -0 told from 0."""
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.signbit(a), np.signbit(b))


weights = st.tuples(st.integers(1, 70), st.integers(1, 3), st.integers(0, 2**31 - 1),
                    st.sampled_from(sorted(FLOAT_DTYPES)), st.sampled_from([0.02, 1.0, 3e4]))


def drawn(k, n, seed, dtype, scale):
    top = float(ml_dtypes.finfo(FLOAT_DTYPES[dtype]).max)
    w = np.clip(heavy((k, n), seed, scale=scale, dtype=np.float64), -top, top).astype(FLOAT_DTYPES[dtype])
    w[: min(k, 32), 0] = 0  # an all-zero block
    return w


@settings(max_examples=60, deadline=None)
@given(st.one_of(weights.map(lambda t: drawn(*t)), extreme_weights(max_rows=70, max_columns=3)))
def test_mxfp4_follows_its_rule(w):
    q = quantize_fp4(w, axis=0, format="mxfp4")
    codes, scales = mx_rule(w)
    assert q.codes.dtype == ml_dtypes.float4_e2m1fn and q.scales.dtype == ml_dtypes.float8_e8m0fnu
    assert q.zero_points is None and q.tensor_scale is None and q.group == 32
    same(as_floats(q.codes), codes)
    same(as_floats(q.scales), scales)


@settings(max_examples=60, deadline=None)
@given(st.one_of(weights.map(lambda t: drawn(*t)), extreme_weights(max_rows=70, max_columns=3)))
def test_nvfp4_follows_its_rule(w):
    q = quantize_fp4(w, axis=0, format="nvfp4")
    codes, scales, g = nv_rule(w)
    assert q.codes.dtype == ml_dtypes.float4_e2m1fn and q.scales.dtype == ml_dtypes.float8_e4m3fn
    assert q.tensor_scale.dtype == np.float32 and q.tensor_scale.tobytes() == np.float32(g).tobytes()
    same(as_floats(q.scales), scales)
    same(as_floats(q.codes), codes)


def test_all_zero_blocks_and_weights():
    w = np.zeros((64, 2), np.float32)
    w[32:, 1] = 0.75
    mx = quantize_fp4(w, axis=0, format="mxfp4")
    assert as_floats(mx.scales).tolist() == [[2.0 ** -127, 2.0 ** -127], [2.0 ** -127, 2.0 ** -3]]
    assert not as_floats(mx.codes)[:, 0].any() and mx.stats.sq_error == 0
    nv = quantize_fp4(np.zeros((16, 3), np.float16), axis=0, format="nvfp4")
    assert nv.tensor_scale == 0 and not as_floats(nv.scales).any() and not as_floats(nv.codes).any()
    assert nv.stats.relative == 0


def test_rounding_ties_go_to_the_even_code_and_beyond_six_saturates():
    # block max 4 -> e = 0: x / 2^0 is x itself
    x = np.array([4, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, -0.25, 0.2, 5.01] + [0] * 20, np.float32)[:, None]
    q = quantize_fp4(x, axis=0, format="mxfp4")
    assert as_floats(q.codes)[:12, 0].tolist() == [4, 0, 1, 1, 2, 2, 4, 4, -4, -0.0, 0, 6]
    y = np.array([7.9] + [0] * 31, np.float32)[:, None]  # max 7.9 -> e = 0, 7.9 clamped to 6
    assert as_floats(quantize_fp4(y, axis=0, format="mxfp4").codes)[0, 0] == 6


@pytest.mark.torch
def test_torchao_reference_functions():
    """torchao's MX (to_mx, its default FLOOR scale mode) and NVFP4 (NVFP4Tensor.to_nvfp4 with the
    per-tensor scale g) on the same weight: the same scales, and the same weight given back.
    Where they differ from the rules, on weights these are not: torchao's NVFP4 clamps a block
    scale below float8e4m3fn's smallest normal (2^-6) up to it, where the rule rounds it to
    nearest (subnormal, or 0); and it multiplies by a reciprocal in float32, (1 / g) / s, then
    rounds to float4 (rounded twice, where the rule rounds the exact quotient).  torch and torchao
    are the `torch` extra (`make test-torch`; a CPU build of torch is hundreds of MB), not the
    test extra: without them this is skipped, saying so."""
    import torch
    from torchao.prototype.mx_formats import mx_tensor, nvfp4_tensor
    w = heavy((128, 64), 3)
    t = torch.from_numpy(w.T.copy())  # torchao blocks along the last axis: [N, K]
    fp4 = torch.float4_e2m1fn_x2
    scale, data = mx_tensor.to_mx(t, fp4, 32)
    mx = quantize_fp4(w, axis=0, format="mxfp4")
    np.testing.assert_array_equal(as_floats(mx.scales).T, 2.0 ** (scale.view(torch.uint8).numpy().astype(np.float64) - 127))
    theirs = mx_tensor.to_dtype(data, scale, fp4, 32, torch.float32).numpy().T
    np.testing.assert_array_equal(theirs, as_floats(mx.codes).astype(np.float32) * np.repeat(as_floats(mx.scales), 32, axis=0).astype(np.float32))
    nv = quantize_fp4(w, axis=0, format="nvfp4")
    g = torch.tensor(float(nv.tensor_scale), dtype=torch.float32)
    assert float(nvfp4_tensor.per_tensor_amax_to_scale(t.abs().max())) == float(nv.tensor_scale)
    ours = nvfp4_tensor.NVFP4Tensor.to_nvfp4(t, per_tensor_scale=g)
    np.testing.assert_array_equal(ours.scale.float().numpy().reshape(64, -1).T, as_floats(nv.scales))
    divisor = (as_floats(nv.scales).astype(np.float32) * nv.tensor_scale).astype(np.float32)
    np.testing.assert_array_equal(ours.dequantize(torch.float32).numpy().T,
                                  as_floats(nv.codes).astype(np.float32) * np.repeat(divisor, 16, axis=0))


@pytest.mark.parametrize("kw,argument,found", [
    (dict(format="mxfp4", group_size=64), "group_size", "64 with format 'mxfp4'"),
    (dict(format="nvfp4", bits=8), "bits", "8 with format 'nvfp4'"),
    (dict(format="mxfp4", scale_dtype="float16"), "scale_dtype", "'float16' with format 'mxfp4'"),
    (dict(format="nvfp4", method="search"), "method", "'search' with format 'nvfp4'"),
    (dict(format="fp8"), "format", "'fp8'"),
    (dict(bits=3), "bits", "3"),
])
def test_combinations_that_make_no_sense_are_named(kw, argument, found):
    with pytest.raises(OptionError) as e:
        dyndq.quantize(probe_model(np.float32), evaluate=False, **kw)
    assert [(p.argument, p.found) for p in e.value.problems] == [(argument, found)]


def test_the_format_block_may_be_named():
    _, report = dyndq.quantize(probe_model(np.float32), format="mxfp4", group_size=32, evaluate=False)
    assert report.options.group_size == 32 and report.as_dict()["settings"]["format"] == "mxfp4"
    _, report = dyndq.quantize(probe_model(np.float32), format="nvfp4", evaluate=False)
    assert report.options.group_size == 16


K, N, VOCAB = 72, 5, 40  # (72: not a multiple of 16 or 32, so the last block is short and sliced away)


def probe_model(dtype):
    """eye [K, K] @ W [K, N] and Gather(E [VOCAB, K], ids): fed the identity and every id, the
    outputs are the weights the graph gives back, exactly on every engine (sums of one product)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("MatMul", ["eye", "W"], ["w"], name="mm"),
             helper.make_node("Gather", ["E", "ids"], ["e"], name="embed")]
    inits = [nh.from_array(heavy((K, N), 1, dtype=dtype), "W"), nh.from_array(heavy((VOCAB, K), 2, dtype=dtype), "E")]
    g = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("eye", elem, [K, K]),
                                           helper.make_tensor_value_info("ids", T.INT64, [VOCAB])],
                          [helper.make_tensor_value_info("w", elem, [K, N]), helper.make_tensor_value_info("e", elem, [VOCAB, K])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def feeds(dtype):
    return {"eye": np.eye(K, dtype=dtype), "ids": np.arange(VOCAB, dtype=np.int64)}


def expected(model, dtype, kw):
    """The weights as each rule gives them back: the test's own implementations of the FP4 rules
    (float32(code) * float32(scale), rounded to the weight's dtype); for 2 bits, the codes,
    scales and zero points the model holds (ONNX Runtime's, tests/quantization/test_rtn_exact.py)."""
    w = nh.to_array(model.graph.initializer[0])
    e = nh.to_array(model.graph.initializer[1])
    out = []
    for weight, along_rows in ((w, True), (e, False)):
        m = weight if along_rows else weight.T
        if kw.get("format") == "mxfp4":
            codes, scales = mx_rule(m)
            block = 32
            scale = np.repeat(scales.astype(np.float32), block, axis=0)
        else:
            codes, scales, g = nv_rule(m)
            block = 16
            scale = np.repeat((scales.astype(np.float32) * g).astype(np.float32), block, axis=0)
        values = (codes.astype(np.float32) * scale)[: m.shape[0]].astype(dtype)
        out.append(values if along_rows else values.T)
    return out


def two_bit_expected(quantized, dtype):
    inits = {t.name: nh.to_array(t) for t in quantized.graph.initializer}
    out = []
    for name, axis in (("W", 0), ("E", 1)):
        codes = inits[f"{name}_quantized"].astype(np.float32)
        zps = inits.get(f"{name}_zero_points")
        scales = inits[f"{name}_scales"]
        block = codes.shape[axis] // scales.shape[axis]
        rep = lambda a: np.repeat(a, block, axis=axis)  # noqa: E731
        diff = codes - (rep(zps.astype(np.float32)) if zps is not None else 0)
        v = (diff * rep(scales.astype(np.float32))).astype(scales.dtype)
        out.append(np.take(v, np.arange(K), axis=axis).astype(dtype))
    return out


CASES = [(dict(format="mxfp4"), np.float32), (dict(format="mxfp4"), np.float16),
         (dict(format="nvfp4"), np.float32), (dict(format="nvfp4"), np.float16),
         (dict(bits=2, group_size=32), np.float32), (dict(bits=2, symmetric=True, group_size=16), np.float16),
         (dict(bits=2, method="search", group_size=32), np.float32),
         (dict(format="mxfp4"), ml_dtypes.bfloat16), (dict(format="nvfp4"), ml_dtypes.bfloat16),
         (dict(bits=2, group_size=32), ml_dtypes.bfloat16)]


def quantized_probe(kw, dtype):
    model = probe_model(dtype)
    out, report = dyndq.quantize(model, evaluate=False, **kw)
    assert {layer.name for layer in report.layers} == {"W", "E"}
    w, e = two_bit_expected(out, dtype) if "bits" in kw else expected(model, dtype, kw)
    # (eye @ W sums -0 with +0 products: a weight of -0 comes out +0 there; Gather gives every bit)
    return out, [np.where(w == 0, np.zeros((), dtype), w), e]


def bits_equal(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8))


@pytest.mark.parametrize("kw,dtype", CASES)
def test_quantized_models_give_the_rule_s_weights_on_the_reference_engine_and_onnxruntime(kw, dtype):
    """(and `export` writes standard ONNX of them, which onnx.reference runs to the same bits)"""
    out, want = quantized_probe(kw, dtype)
    onnx.checker.check_model(out, full_check=True)
    version = {o.domain: o.version for o in out.opset_import}["org.dyndq"]
    assert version == 3
    ran = dyndq.run(out, feeds(dtype))
    bits_equal([ran["w"], ran["e"]], want)
    standard = dyndq.export(out)
    assert not any(n.domain == "org.dyndq" for n in standard.graph.node)
    bits_equal(ReferenceEvaluator(standard).run(None, feeds(dtype)), want)
    if dtype == ml_dtypes.bfloat16:
        return  # (ONNX Runtime's CPU provider has no bfloat16 MatMul)
    exported = dyndq.export(out, target="onnxruntime")
    bits_equal(run_onnxruntime(exported, feeds(dtype)), want)
    if "bits" in kw:  # 2-bit codes go back to ONNX Runtime's own 2-bit MatMulNBits, exactly (above)
        written = [n for n in exported.graph.node if n.op_type == "MatMulNBits"]
        assert [next(a.i for a in n.attribute if a.name == "bits") for n in written] == [2], exported.graph.node


@pytest.mark.openvino
@pytest.mark.parametrize("kw,dtype", [c for c in CASES if c[1] != ml_dtypes.bfloat16])
def test_quantized_models_give_the_rule_s_weights_on_openvino(kw, dtype):
    """(bfloat16 left out: OpenVINO's constant folding truncates float32 to bfloat16, a deviation
    converters/engines.py lists.)"""
    needs_openvino()
    out, want = quantized_probe(kw, dtype)
    exported = dyndq.export(out, target="openvino")
    bits_equal(run_openvino(exported, feeds(dtype)), want)
