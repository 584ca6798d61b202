"""The data-aware methods write the same bytes in another process at another BLAS thread count
(dyndq/quantization/reproducible.py; docs/quantize.md, "Reproducible").

Each case quantizes one small model in two fresh processes, one with OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS at 1 and one at 2 (OPENBLAS_CORETYPE is left as it is), and compares the
sha256 of each written model and of GPTQ's inverse-Hessian factor U (gptq.upper_inverse_cholesky:
NumPy's Cholesky, which OpenBLAS splits over threads from K = 128 up, summing in another order).
Without one_blas_thread U differs in its last bits between the two processes (checked on a
2-core machine); on a machine with one core OpenBLAS runs one thread either way and the two runs
agree trivially."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh

K = 256  # (np.linalg.cholesky of K x K splits over OpenBLAS's threads from K = 128)

CHILD = r"""
import hashlib, json, sys
import numpy as np, onnx
import dyndq
from dyndq.quantization import gptq

factors = []
made = gptq.upper_inverse_cholesky

def recorded(h):
    u = made(h)
    factors.append(hashlib.sha256(u.tobytes()).hexdigest())
    return u

gptq.upper_inverse_cholesky = recorded
model = onnx.load(sys.argv[1])
data = np.load(sys.argv[2])
feeds = [{"x": data[name]} for name in sorted(data.files)]
out = {}
for name, options in json.loads(sys.argv[3]).items():
    q, _ = dyndq.quantize(model, inputs=feeds, evaluate=False, **options)
    out[name] = hashlib.sha256(q.SerializeToString()).hexdigest()
out["U"] = factors
print(json.dumps(out))
"""

METHODS = {"gptq": {"method": "gptq"},
           "gptq act_order + scale estimation": {"method": "gptq", "act_order": True, "scale_estimation": True},
           "awq + scale estimation": {"method": "awq", "scale_estimation": True},
           "search + scale estimation": {"method": "search", "scale_estimation": True}}


def two_layers(seed: int = 0) -> onnx.ModelProto:
    """x [m, K] -> W1 [K, K] -> Relu -> W2 [K, 64]: GPTQ factors a K x K Hessian for each."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32)
    w2 = (rng.standard_normal((K, 64)) / np.sqrt(K)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"])]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", T.FLOAT, ["m", K])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["m", 64])],
                          [nh.from_array(w1, "W1"), nh.from_array(w2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def quantized_in_child(tmp_path, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "model.onnx"), str(tmp_path / "samples.npz"),
                        json.dumps(METHODS)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_data_aware_codes_are_the_same_bytes_at_one_and_two_blas_threads(tmp_path):
    onnx.save(two_layers(), tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    mix = np.eye(K) + rng.standard_normal((K, K)) / 8  # (correlated channels: a Hessian far from diagonal)
    np.savez(tmp_path / "samples.npz", **{f"s{i}": (rng.standard_normal((96, K)) @ mix).astype(np.float32)
                                          for i in range(4)})
    one, two = quantized_in_child(tmp_path, 1), quantized_in_child(tmp_path, 2)
    assert len(one["U"]) >= 4  # (each K x K factor of gptq's two cases was made, and compared)
    assert one["U"] == two["U"], "GPTQ's inverse-Hessian factor differs between 1 and 2 BLAS threads"
    for name in METHODS:
        assert one[name] == two[name], f"{name}: the written model differs between 1 and 2 BLAS threads"
