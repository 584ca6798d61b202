"""A GPTQ checkpoint of a real model's weights, for the import's end-to-end test and docs/import.md.

GPTQModel and AutoGPTQ do not install on this CPU setup (tests/safetensors_checkpoints.py says
why), so the checkpoint is made here, in three steps, each said in the docs:

1. the float weights: the 36 MatMul weights of all-MiniLM-L6-v2's ONNX export (`make
   test-trained-export`: .test-models/minilm.onnx), each named by its Hugging Face module
   (`encoder.layer.0.attention.self.query`: the MatMul node's name torch.onnx.export gives, as a
   GPTQ checkpoint of the model names its modules), in torch's [out, in];
2. the rounding: GPTQ's algorithm (Frantar et al. 2022, the `fasterquant` loop of AutoGPTQ's and
   GPTQModel's gptq.py, written again in NumPy: the inverse Hessian's Cholesky factor, columns in
   blocks of 128, each column's rounding error spread over the columns not yet rounded), 4 bits,
   groups of 128, symmetric (zero point 8), damping 0.01, no act-order; its Hessian from the float
   model's own activations at each MatMul's input over the 32 "chosen" sentences
   (trained_models.SENTENCES: GPTQModel feeds each layer the quantized layers' outputs before it,
   this feeds the float model's: a simplification, said);  `rtn=True` rounds to nearest instead;
3. the layout: GPTQ v1 (`checkpoint_format` "gptq": zero points stored minus one), 8 codes an
   int32 along the inputs, packed by tests/safetensors_checkpoints.pack_bits (the packer the tests
   check against GPTQ's own unpacking), float16 scales, `g_idx`, and a config.json with its
   quantization_config, in a folder of one model.safetensors.

    .venv/bin/python tests/gptq_minilm.py make FOLDER [--rtn | --act-order]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trained_models as tm  # noqa: E402
from safetensors_checkpoints import pack_bits  # noqa: E402

BITS, GROUP, DAMP, BLOCK = 4, 128, 0.01, 128
CONFIG = {"quant_method": "gptq", "bits": BITS, "group_size": GROUP, "desc_act": False, "sym": True,
          "damp_percent": DAMP, "checkpoint_format": "gptq"}


def matmul_weights(model: onnx.ModelProto) -> dict[str, tuple[str, str, np.ndarray]]:
    """module name -> (initializer, the MatMul's input A, float weight [out, in]) for each MatMul
    reading a 2-D float initializer, named from the node's name (/encoder/layer.0/attention/self/query/MatMul)."""
    inits = {t.name: t for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or len(inits[node.input[1]].dims) != 2:
            continue
        module = ".".join(node.name.strip("/").split("/")[:-1]).removeprefix("bert.")  # (BertModel's own names)
        found[module] = (node.input[1], node.input[0], numpy_helper.to_array(inits[node.input[1]]).T.copy())
    return found


def activations(model: onnx.ModelProto, inputs: dict[str, str], feeds: list[dict]) -> dict[str, np.ndarray]:
    """Each MatMul's input A over the sentences' real tokens (the padding masked out): [tokens, in]."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    shown = {o.name for o in probe.graph.output}
    for name in set(inputs.values()) - shown:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    seen: dict[str, list] = {a: [] for a in inputs.values()}
    for feed in feeds:
        got = dict(zip(names, session.run(None, feed)))
        keep = feed["attention_mask"].reshape(-1) > 0
        for a in seen:
            seen[a].append(got[a].reshape(-1, got[a].shape[-1])[keep])
    return {module: np.concatenate(seen[a]).astype(np.float64) for module, a in inputs.items()}


def _scale(w: np.ndarray) -> np.ndarray:
    """GPTQ's symmetric quantizer's scale per row of w [out, group] (find_params, sym=True)."""
    top = np.maximum(np.abs(w.min(1)), np.abs(w.max(1)))
    top[top == 0] = 1
    return 2 * top / (2 ** BITS - 1)


def gptq(w: np.ndarray, x: np.ndarray, *, rtn: bool = False, act_order: bool = False):
    """(codes uint8 [out, in], float16 scales [out, groups], g_idx [in]) of w [out, in] by GPTQ's
    loop on the Hessian 2 X^T X / n of activations x [n, in] (or round to nearest, `rtn`);
    `act_order` (desc_act): the columns rounded in the order of the Hessian's diagonal, largest
    first, each group of 128 in that order, g_idx saying each input's group.  Held transposed
    ([in, out]: a column of GPTQ's is a contiguous row here)."""
    out, n_in = w.shape
    zero, top = 2 ** (BITS - 1), 2 ** BITS - 1
    if rtn:
        s = _scale(w.reshape(-1, GROUP).astype(np.float64)).reshape(out, n_in // GROUP)
        q = np.clip(np.round(w / np.repeat(s, GROUP, 1)) + zero, 0, top).astype(np.uint8)
        return q, s.astype(np.float16), (np.arange(n_in) // GROUP).astype(np.int32)
    wt = w.T.astype(np.float64)
    scales = np.zeros((n_in // GROUP, out))
    codes = np.zeros((n_in, out), np.uint8)
    h = 2 * x.T @ x / len(x)
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    wt[dead] = 0
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(n_in)
    wt, h = wt[order], h[np.ix_(order, order)]
    h[np.diag_indices(n_in)] += DAMP * np.mean(np.diag(h))
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # (upper: torch.linalg.cholesky(..., upper=True))
    for i1 in range(0, n_in, BLOCK):
        i2 = min(i1 + BLOCK, n_in)
        w1, err1, hinv1 = wt[i1:i2].copy(), np.zeros((i2 - i1, out)), hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % GROUP == 0:  # (the block's first column: w1 is wt here, as GPTQ finds the group's scale)
                scales[col // GROUP] = _scale(wt[col:col + GROUP].T)
            s = scales[col // GROUP]
            q = np.clip(np.round(w1[i] / s) + zero, 0, top)
            codes[col] = q
            err = (w1[i] - s * (q - zero)) / hinv1[i, i]
            w1[i:] -= np.outer(hinv1[i, i:], err)
            err1[i] = err
        wt[i2:] -= hinv[i1:i2, i2:].T @ err1
    # stored as float16, as GPTQ's pack() does: it finds the codes again by dividing by the float16
    # scales, which gives the same codes (|q - z| <= 8 times a scale's relative rounding, 2^-11, is far from 0.5)
    g_idx = np.empty(n_in, np.int32)
    g_idx[order] = np.arange(n_in) // GROUP
    unsorted = np.empty_like(codes)
    unsorted[order] = codes
    return np.ascontiguousarray(unsorted.T), np.ascontiguousarray(scales.T).astype(np.float16), g_idx


def dequantized(codes: np.ndarray, s16: np.ndarray, g: np.ndarray) -> np.ndarray:
    """GPTQ's `scales[g_idx] * (q - zeros[g_idx])` in float16 ([out, in]), zero point 8."""
    return (s16[:, g] * (codes.astype(np.int16) - 2 ** (BITS - 1)).astype(np.float16)).astype(np.float16)


def make(folder: Path, *, rtn: bool = False, act_order: bool = False) -> dict[str, np.ndarray]:
    """Write the checkpoint into `folder`; return each module's GPTQ dequantization (float16 [out, in])."""
    from safetensors.numpy import save_file

    model = onnx.load(str(tm.path_of("minilm")))
    found = matmul_weights(model)
    xs = activations(model, {m: a for m, (_, a, _) in found.items()}, tm.minilm_inputs("chosen"))
    tensors, values = {}, {}
    for module, (_, _, w) in found.items():
        codes, s16, g_idx = gptq(w, xs[module], rtn=rtn, act_order=act_order)
        groups = codes.shape[1] // GROUP
        zeros = np.full((groups, codes.shape[0]), 2 ** (BITS - 1) - 1, np.uint8)  # (v1: the zero point minus one)
        tensors[f"{module}.qweight"] = np.ascontiguousarray(pack_bits(np.ascontiguousarray(codes), BITS).T)
        tensors[f"{module}.qzeros"] = pack_bits(zeros, BITS)
        tensors[f"{module}.scales"] = np.ascontiguousarray(s16.T)
        tensors[f"{module}.g_idx"] = g_idx
        values[module] = dequantized(codes, s16, g_idx)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {**CONFIG, "desc_act": act_order}
    (folder / "config.json").write_text(json.dumps({"quantization_config": config}, indent=1))
    return values


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "make":
        raise SystemExit(__doc__)
    if (why := tm.minilm_missing()) is not None:
        raise SystemExit(why)
    make(Path(sys.argv[2]), rtn="--rtn" in sys.argv[3:], act_order="--act-order" in sys.argv[3:])
