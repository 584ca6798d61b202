"""Our GPTQ beside ONNX Runtime's on one layer and the same calibration data.

ONNX Runtime's `MatMulNBitsQuantizer` with `GPTQWeightOnlyQuantConfig` runs a NumPy port of
Intel Neural Compressor's GPTQ that it ships itself (onnxruntime/quantization/neural_compressor/
weight_only.py; neural-compressor need not be installed).  Its `to_numpy` imports torch only to
ask whether a sample is a torch tensor; ours are NumPy arrays, so where torch is not installed an
empty module stands in for it during the call (nothing of it is used).

What this finds (ONNX Runtime 1.32): that port's updates read the column of the upper
Cholesky factor below its diagonal (`Hinv1[i:, i]`, `Hinv[i2:, i1:i2]`: zeros), where the paper's
algorithm reads its row, so no rounding error is fed forward and its codes are round to nearest:
the same codes whatever the Hessian (`test_..._ignores_the_hessian`), its output error rtn's
within 1% (its own rounding rule: ties to even, a division).  Ours is below it by far on the
same data (0.43 to 0.44x on these draws; required below 0.7x).  When a later ONNX Runtime feeds
the error forward, the first test fails, and this comparison becomes one of two GPTQs: the
docs (docs/quantize.md, "gptq") then need the new figure.
"""
from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper as nh, TensorProto as T

from dyndq.quantization import formats
from dyndq.quantization.gptq import gptq_weight
from dyndq.quantization.numerics import quantize_weight

K, N, ROWS, SAMPLES, GROUP = 256, 128, 32, 8, 128


@pytest.fixture
def torch_stand_in(monkeypatch):
    if importlib.util.find_spec("torch") is None:
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))


def layer(seed: int):
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((K, K)) / np.sqrt(K) + np.eye(K)
    xs = [(rng.standard_normal((ROWS, K)) @ mix * rng.uniform(0.2, 3, K)).astype(np.float32) for _ in range(SAMPLES)]
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [ROWS, K])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [ROWS, N])], [nh.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), w, xs


def onnxruntime_gptq(model: onnx.ModelProto, xs) -> np.ndarray:
    """ONNX Runtime's GPTQ (4 bits, blocks of 128, asymmetric, damping 0.01, no act-order) on
    `model`: the weight its MatMulNBits gives back, [K, N] float32."""
    quantizer_module = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    class Samples(CalibrationDataReader):
        def __init__(self):
            self.rewind()

        def get_next(self):
            return next(self.samples, None)

        def rewind(self):
            self.samples = iter([{"x": x} for x in xs])

    config = quantizer_module.GPTQWeightOnlyQuantConfig(calibration_data_reader=Samples(), percdamp=0.01,
                                                        block_size=GROUP, actorder=False, mse=False, perchannel=True)
    quantizer = quantizer_module.MatMulNBitsQuantizer(model, block_size=GROUP, is_symmetric=False, algo_config=config)
    quantizer.process()
    t = {i.name: nh.to_array(i) for i in quantizer.model.model.graph.initializer}
    blob = next(v for name, v in t.items() if name.startswith("W_Q4"))  # [N, blocks, 64]: two codes a byte, low first
    blocks = blob.shape[1]
    codes = np.stack([blob & 15, blob >> 4], -1).reshape(N, blocks * GROUP)[:, :K].astype(np.float32)
    zero = np.stack([t["W_zp"] & 15, t["W_zp"] >> 4], -1).reshape(N, -1)[:, :blocks].astype(np.float32)
    scale = t["W_scale"].reshape(N, blocks)
    return ((codes - np.repeat(zero, GROUP, 1)[:, :K]) * np.repeat(scale, GROUP, 1)[:, :K]).T


def output_error(x: np.ndarray, w: np.ndarray, dequantized: np.ndarray) -> float:
    return float(np.sum((x.astype(np.float64) @ (w - dequantized).astype(np.float64)) ** 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_ours_errs_less_than_onnxruntimes_gptq_on_one_layer(torch_stand_in, seed):
    """On one MatMul (K = 256, N = 128, 8 samples of 32 rows with correlated channels): ONNX
    Runtime's GPTQ errs as rtn does (within 1%: it feeds no error forward, see the module doc);
    ours errs below 0.7x of it on the same data."""
    model, w, xs = layer(seed)
    theirs = onnxruntime_gptq(model, xs)
    x = np.concatenate(xs)
    fmt = formats.get("int")
    ours = fmt.dequantize(gptq_weight(w, x.astype(np.float64).T @ x.astype(np.float64), axis=0, group_size=GROUP,
                                      bits=4, symmetric=False, scale_dtype="float32"), np.float32)
    rtn = fmt.dequantize(quantize_weight(w, axis=0, group_size=GROUP, bits=4), np.float32)
    e_theirs, e_ours, e_rtn = (output_error(x, w, d) for d in (theirs, ours, rtn))
    assert abs(e_theirs / e_rtn - 1) < 0.01, (e_theirs, e_rtn)
    assert e_ours < 0.7 * e_theirs, (e_ours, e_theirs)


def test_onnxruntimes_gptq_ignores_the_hessian(torch_stand_in):
    """Its `gptq` gives the same codes for X^T X as for the identity: nothing is fed forward."""
    weight_only = pytest.importorskip("onnxruntime.quantization.neural_compressor.weight_only")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, 64))
    a = rng.standard_normal((500, K)) @ (rng.standard_normal((K, K)) / 16 + np.eye(K))
    with_data = weight_only.gptq(w.copy(), 2 * a.T @ a, group_size=GROUP, actorder=False)
    without = weight_only.gptq(w.copy(), np.eye(K), group_size=GROUP, actorder=False)
    np.testing.assert_array_equal(with_data, without)
