"""`--emit onnxruntime`: ONNX Runtime's fused ops where the checkpoint's format fits them exactly
(GGUF Q4_0 and Q8_0 on a MatMul's B: MatMulNBits; on a Gather's table: GatherBlockQuantized), the
composition elsewhere, and the report's form per weight with its reason.

Each fused weight is compared bit for bit with gguf's dequantization through the fused node
itself on ONNX Runtime: MatMulNBits with A = identity(K) gives W (each output the sum of one weight
and zeros: equal in value, a -0 weight may come out +0), GatherBlockQuantized of every row gives
the table.  The model's outputs equal the float model holding gguf's weights within 1e-5 of the
largest (ONNX Runtime's MatMul sums in its own order)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
import gguf_models
from dyndq.cli import main
from engines import run_onnxruntime
from gguf_blocks import gguf, qtype
from gguf_models import DOWN, EMBED, HEAD_W, K, Q, UP, expected, float_model, gguf_tensors, ids, source_weights, write_gguf

MS = "com.microsoft"


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def alone(model: onnx.ModelProto, node: onnx.NodeProto, replaced: int, value: np.ndarray) -> np.ndarray:
    """`node` of the exported `model` run by itself on ONNX Runtime, its input `replaced` fed `value`."""
    inits = {t.name: t for t in model.graph.initializer}
    feed = node.input[replaced]
    graph = helper.make_graph([node], "alone", [helper.make_tensor_value_info(
        feed, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
        [inits[n] for n in node.input if n in inits and n != feed])
    alone_model = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return run_onnxruntime(alone_model, {feed: value})[0]


def weights_through_fused(exported: onnx.ModelProto) -> dict[str, np.ndarray]:
    """{the fused node's output: the weights it computes}: MatMulNBits with A = identity, GatherBlockQuantized of every row."""
    out = {}
    for n in exported.graph.node:
        attrs = {a.name: a.i for a in n.attribute}
        if n.domain == MS and n.op_type == "MatMulNBits":
            out[n.output[0]] = alone(exported, n, 0, np.eye(attrs["K"], dtype=np.float32))
        elif n.domain == MS and n.op_type == "GatherBlockQuantized":
            rows = next(t for t in exported.graph.initializer if t.name == n.input[0]).dims[0]
            out[n.output[0]] = alone(exported, n, 1, np.arange(rows, dtype=np.int64))
    return out


def same_bits(got: np.ndarray, want: np.ndarray, zeros_by_value: bool = False) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    differ = got.view(np.uint32) != want.view(np.uint32)
    if zeros_by_value:
        differ &= ~((got == 0) & (want == 0))
    assert not differ.any(), f"{differ.sum()} of {want.size} differ, the first at {np.flatnonzero(differ)[0]}"


@pytest.mark.parametrize("k_type,embed_type", [("Q4_0", "Q8_0"), ("Q8_0", "Q4_0")])
def test_q4_0_and_q8_0_become_fused_ops_giving_ggufs_bits(tmp_path, monkeypatch, k_type, embed_type):
    monkeypatch.setitem(gguf_models.TYPES, "blk.0.attn_k.weight", k_type)
    monkeypatch.setitem(gguf_models.TYPES, "token_embd.weight", embed_type)
    src = source_weights()
    tensors = gguf_tensors(src)
    write_gguf(tmp_path / "m.gguf", tensors)
    model = float_model(src)
    out, report = dyndq.import_weights(model, tmp_path / "m.gguf", emit="onnxruntime")
    bits = {"Q4_0": 4, "Q8_0": 8}
    assert report.forms[K] == f"com.microsoft::MatMulNBits {bits[k_type]}-bit block 32, float32 scales (d widened)"
    assert report.forms[EMBED] == (f"com.microsoft::GatherBlockQuantized {bits[embed_type]}-bit block 32, "
                                   "float32 scales (d widened)")
    assert ops(out).count("MatMulNBits") == 1 and ops(out).count("GatherBlockQuantized") == 1
    # the rest: the composition, each with its reason
    assert report.forms[Q].startswith("composition: read by Transpose")
    assert report.forms[UP].startswith("composition: a min per sub-block")  # Q5_K
    assert report.forms[DOWN].startswith("composition: a min added after the product")  # Q4_1
    assert report.forms[HEAD_W].startswith("composition: 5-bit codes")  # Q5_0
    rows = {r.weight: r for r in report.imported}
    assert rows[K].orientation == "transposed"  # (as the model reads it: the decode itself is written [in, out])
    # the weights through the fused nodes: gguf's float32 bits
    want = expected(tensors)
    fused = weights_through_fused(out)
    matmul = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    gather = next(n for n in out.graph.node if n.op_type == "GatherBlockQuantized")
    same_bits(fused[matmul.output[0]], want[K], zeros_by_value=True)
    same_bits(fused[gather.output[0]], want[EMBED])
    # the outputs: the float model holding gguf's weights, within 1e-5 of the largest
    oracle = gguf_models.with_weights(model, want)
    theirs = run_onnxruntime(oracle, ids())
    for value, wanted in zip(run_onnxruntime(out, ids()), theirs):
        np.testing.assert_allclose(value, wanted, rtol=1e-5, atol=1e-5 * float(np.abs(wanted).max()))


def drawn_finite(name: str, rows: int, n_blocks: int, seed: int) -> np.ndarray:
    """Raw Q4_0/Q8_0 blocks: random codes, float16 d drawn over its whole finite range (subnormals,
    -0, 65504 and their negatives included; inf and NaN left out: A = identity would spread them
    along a column as 0 * inf)."""
    rng = np.random.default_rng(seed)
    size = gguf.GGML_QUANT_SIZES[qtype(name)][1]
    data = rng.integers(0, 256, (rows * n_blocks, size), dtype=np.uint8)
    d = rng.integers(0, 1 << 16, rows * n_blocks, dtype=np.uint16).view(np.float16)
    d[~np.isfinite(d)] = np.float16(1.5)
    d[:6] = np.array([0.0, -0.0, 6e-8, -6e-8, 65504, -65504], np.float16)
    data[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, n_blocks * size)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_drawn_blocks_over_the_whole_float16_range_are_exact_through_matmul_nbits(tmp_path, name):
    """Every code value and float16 scales from subnormals to 65504: MatMulNBits with float32
    scales (d widened) gives gguf's float32 product, the same one rounding."""
    n_out, n_in = 64, 128
    data = drawn_finite(name, n_out, n_in // 32, seed=5)
    write_gguf(tmp_path / "w.gguf", {"blk.0.ffn_down.weight": (name, data)})
    w = np.zeros((n_in, n_out), np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n_in, n_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n_in, n_out])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.import_weights(model, tmp_path / "w.gguf", names={"blk.0.ffn_down.weight": "w"},
                                       emit="onnxruntime")
    assert ops(out) == ["MatMulNBits"], ops(out)
    with np.errstate(all="ignore"):
        want = np.ascontiguousarray(gguf.quants.dequantize(data, qtype(name)).astype(np.float32).T)
    same_bits(run_onnxruntime(out, {"x": np.eye(n_in, dtype=np.float32)})[0], want, zeros_by_value=True)
    assert report.forms["w"].startswith("com.microsoft::MatMulNBits")


def test_the_exporter_without_the_rewrite_writes_no_fused_op(tmp_path, monkeypatch):
    """The rewrite is what makes them: without it the decode keeps its blocks' axes and a Transpose."""
    from dyndq.checkpoints import fused

    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    monkeypatch.setattr(fused, "_rewrite", lambda *a: (None, "turned off"))
    out, report = dyndq.import_weights(float_model(src), tmp_path / "m.gguf", emit="onnxruntime")
    assert "MatMulNBits" not in ops(out) and "GatherBlockQuantized" not in ops(out)
    assert report.forms[K] == "composition: turned off"


@pytest.mark.parametrize("two_initializers", [False, True])
def test_a_tied_embedding_keeps_one_decode_and_says_why(tmp_path, monkeypatch, two_initializers):
    """Tied in either form (one initializer read by the Gather and the output projection, or
    lm_head's own initializer matched to token_embd): one decode, the composition, the reason."""
    monkeypatch.setitem(gguf_models.TYPES, "token_embd.weight", "Q4_0")
    src = source_weights()
    if two_initializers:
        src["lm_head"] = src["embed"].copy()
    tensors = gguf_tensors(src, tied=True)
    write_gguf(tmp_path / "t.gguf", tensors)
    out, report = dyndq.import_weights(float_model(src, tied=not two_initializers), tmp_path / "t.gguf",
                                       emit="onnxruntime")
    said = "one decode read by 2 weights" if two_initializers else "read by 2 nodes (Gather, Transpose; a tied embedding)"
    tied = [EMBED, HEAD_W] if two_initializers else [EMBED]
    for weight in tied:
        assert report.forms[weight].startswith(f"composition: {said}"), report.forms[weight]
    assert "GatherBlockQuantized" not in ops(out)
    codes = [t for t in out.graph.initializer if t.data_type == TensorProto.INT4]
    assert len(codes) == 1  # token_embd's codes, once


def test_gptq_on_a_float32_model_keeps_the_composition_with_the_float16_reason(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    from safetensors_checkpoints import gptq_tensors

    UP, N_IN, OUT, GROUP = "model.layers.0.mlp.up_proj", 256, 64, 64
    weight = np.zeros((N_IN, OUT), np.float32)  # ([in, out]: a MatMul's B, the form MatMulNBits would replace)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", f"{UP}.weight"], ["y"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, N_IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, OUT])],
                              [numpy_helper.from_array(weight, f"{UP}.weight")])
    linear_model = lambda: helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)  # noqa: E731

    folder = tmp_path / "ckpt"
    folder.mkdir()
    safetensors.save_file({f"{UP}.{k}": v for k, v in gptq_tensors(N_IN, OUT, 4, GROUP, v1=False, seed=3).items()},
                          str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": GROUP, "checkpoint_format": "gptq_v2"}}))
    out, report = dyndq.import_weights(linear_model(), folder, emit="onnxruntime")
    assert report.forms[f"{UP}.weight"].startswith("composition: the format dequantizes in float16")
    assert "MatMulNBits" not in ops(out)


def test_the_report_says_the_form_per_weight_in_text_and_json(tmp_path, capsys):
    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    onnx.save(float_model(src), tmp_path / "m.onnx")
    args = ["import-weights", str(tmp_path / "m.onnx"), str(tmp_path / "m.gguf"), "--emit", "onnxruntime"]
    assert main(args + ["-o", str(tmp_path / "a.onnx")]) == 0
    said = capsys.readouterr().out
    assert "form: com.microsoft::MatMulNBits 4-bit block 32" in said, said
    assert "form: composition: 5-bit codes" in said
    assert "(2 fused, 5 composition)" in said
    assert main(args + ["-o", str(tmp_path / "b.onnx"), "--json"]) == 0
    rows = {r["weight"]: r for r in json.loads(capsys.readouterr().out)["imported"]}
    assert rows[K]["written_as"].startswith("com.microsoft::MatMulNBits")
    assert rows[HEAD_W]["written_as"].startswith("composition: 5-bit codes")
    # another emit says nothing of forms
    assert main(["import-weights", str(tmp_path / "m.onnx"), str(tmp_path / "m.gguf"), "-o", str(tmp_path / "c.onnx"),
                 "--json"]) == 0
    assert all("written_as" not in r for r in json.loads(capsys.readouterr().out)["imported"])
