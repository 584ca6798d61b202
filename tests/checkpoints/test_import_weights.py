"""dyndq.import_weights: a GGUF file gguf's own writer made, with llama.cpp's names and Q/K row
permutation, put onto a float model with torch's names.  Each weight imported equals gguf's
dequantization (un-permuted, oriented as the model reads it) bit for bit on the reference engine
and ONNX Runtime; the model's outputs equal the float model holding those weights; the matching
by name map, --names and shape, the lists of weights left float and tensors unused, the tied
embedding decoded once, and the refusals."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import dyndq
from engines import run_onnxruntime
from gguf_models import (DOWN, EMBED, HEAD_W, K, NORM, Q, UP, bits, expected, float_model, gguf_tensors, ids, llama_file,
                         source_weights, with_outputs, with_weights, write_gguf)


@pytest.fixture
def llama(tmp_path):
    return llama_file(tmp_path)


def test_each_weight_is_ggufs_dequantization_unpermuted_and_oriented_on_both_engines(llama):
    src, tensors, path = llama
    model = float_model(src)
    before = model.SerializeToString()
    out, report = dyndq.import_weights(model, path)
    assert model.SerializeToString() == before  # (the model passed in is not modified)
    assert dyndq.check(out) == []
    want = expected(tensors)
    assert {r.weight for r in report.imported} == set(want)
    probe = with_outputs(out, list(want))
    got = {"reference": dyndq.run(probe, ids()),
           "onnxruntime": dict(zip(want, run_onnxruntime(dyndq.export(probe, target="onnxruntime"), ids())))}
    for engine, values in got.items():
        for name, value in want.items():
            assert values[name].shape == value.shape, (engine, name)
            assert (bits(values[name]) == bits(value)).all(), f"{name} on {engine}"
    # the Q and K rows un-permuted: without the undo they would be gguf's rows as stored
    rows = {r.weight: r for r in report.imported}
    assert "rotary permutation" in rows[Q].note and "rotary permutation" in rows[K].note
    assert rows[K].orientation == "transposed" and rows[Q].orientation == "as stored"
    assert rows[DOWN].how == "by shape" and rows[DOWN].error < 0.2
    assert rows[Q].how == "by GGUF's name map"
    assert [name for name, *_ in report.unused] == ["blk.0.attn_v.weight"]


def test_the_outputs_equal_the_float_model_holding_the_dequantized_weights(llama):
    src, tensors, path = llama
    model = float_model(src)
    out, _ = dyndq.import_weights(model, path)
    oracle = with_weights(model, expected(tensors))
    # the reference engine: the same MatMul operands in NumPy, so the same bits
    ours, theirs = dyndq.run(out, ids()), dyndq.run(oracle, ids())
    for name in theirs:
        assert (bits(ours[name]) == bits(theirs[name])).all(), name
    # ONNX Runtime: a weight computed at run time against one stored (which it prepacks) may be
    # summed in another order by its MatMul (docs: DESIGN's prepacking fact): a tolerance
    got = run_onnxruntime(dyndq.export(out, target="onnxruntime"), ids())
    for value, name in zip(got, [o.name for o in out.graph.output]):
        np.testing.assert_allclose(value, theirs[name], rtol=1e-5, atol=1e-5 * float(np.abs(theirs[name]).max()))


def test_without_the_permutation_undone_q_would_differ(llama):
    """The undo is needed: gguf's Q rows as stored are not the source's."""
    src, tensors, _ = llama
    from gguf_models import dequantized

    assert not (bits(dequantized(tensors, "blk.0.attn_q.weight")) == bits(expected(tensors)[Q])).all()


def test_tied_embedding_one_initializer_read_twice_is_decoded_once(tmp_path):
    src = source_weights()
    tensors = gguf_tensors(src, tied=True)
    write_gguf(tmp_path / "t.gguf", tensors)
    out, report = dyndq.import_weights(float_model(src, tied=True), tmp_path / "t.gguf")
    codes = [t for t in out.graph.initializer if t.data_type == onnx.TensorProto.INT8 and list(t.dims)[:1] == [64]]
    assert len(codes) == 1  # token_embd's Q8_0 codes, once
    assert (bits(dyndq.run(with_outputs(out, [EMBED]), ids())[EMBED]) == bits(expected(tensors, tied=True)[EMBED])).all()


def test_tied_embedding_two_initializers_share_one_decode(tmp_path):
    """lm_head's own initializer, equal to the embedding, in a file without output.weight (as
    llama.cpp writes tied models): matched by shape to token_embd, read from the one decode."""
    src = source_weights()
    src["lm_head"] = src["embed"].copy()
    tensors = gguf_tensors(src, tied=True)
    write_gguf(tmp_path / "t.gguf", tensors)
    out, report = dyndq.import_weights(float_model(src), tmp_path / "t.gguf")
    rows = {r.weight: r for r in report.imported}
    assert rows[HEAD_W].tensor == "token_embd.weight" and rows[HEAD_W].how == "by shape"
    assert "one decode with" in rows[HEAD_W].note
    codes = [t for t in out.graph.initializer if t.data_type == onnx.TensorProto.INT8 and list(t.dims)[:1] == [64]]
    assert len(codes) == 1
    values = dyndq.run(with_outputs(out, [EMBED, HEAD_W]), ids())
    want = expected(tensors, tied=True)[EMBED]
    assert (bits(values[EMBED]) == bits(want)).all() and (bits(values[HEAD_W]) == bits(want)).all()


def test_names_map_and_left_float(llama):
    src, tensors, path = llama
    model = float_model(src, names={Q: "w_q_custom"}, extra=True)
    out, report = dyndq.import_weights(model, path, names={"blk.0.attn_q.weight": "w_q_custom"})
    rows = {r.weight: r for r in report.imported}
    assert rows["w_q_custom"].how == "by --names" and "rotary permutation" in rows["w_q_custom"].note
    assert [name for name, _ in report.left_float] == ["extra.bias"]
    assert (bits(dyndq.run(with_outputs(out, ["w_q_custom"]), ids())["w_q_custom"]) == bits(expected(tensors)[Q])).all()


def test_refusals_name_the_tensor(llama, tmp_path):
    src, tensors, path = llama
    model = float_model(src)
    with pytest.raises(dyndq.ValidationError, match="no tensor of that name"):
        dyndq.import_weights(model, path, names={"nope": Q})
    with pytest.raises(dyndq.ValidationError, match="none in the model"):
        dyndq.import_weights(model, path, names={"blk.0.attn_v.weight": "missing"})
    bad = dict(tensors)
    bad["blk.0.attn_q.weight"] = tensors["blk.0.attn_v.weight"]  # [128, 256] where q is [256, 256]
    write_gguf(tmp_path / "bad.gguf", bad)
    with pytest.raises(dyndq.ValidationError, match="blk.0.attn_q.weight.*shape \\[128, 256\\]"):
        dyndq.import_weights(model, tmp_path / "bad.gguf")
    write_gguf(tmp_path / "none.gguf", {"unrelated.weight": ("F32", np.ones((3, 5), np.float32))})
    with pytest.raises(dyndq.ValidationError, match="no tensor of its 1 matched"):
        dyndq.import_weights(model, tmp_path / "none.gguf")
    with pytest.raises(dyndq.ValidationError, match="emit"):
        dyndq.import_weights(model, path, emit="tensorrt")


def test_the_float_models_opset_is_raised_when_lower(llama):
    src, tensors, path = llama
    model = float_model(src)
    model.opset_import[0].version = 17
    model.ir_version = 8
    out, report = dyndq.import_weights(model, path)
    assert "raised to 21" in report.converted and dyndq.check(out) == []
    assert (bits(dyndq.run(with_outputs(out, [UP, NORM]), ids())[UP]) == bits(expected(tensors)[UP])).all()


def test_a_weight_inside_a_subgraph_is_refused_by_name(llama):
    """A checkpoint tensor naming an initializer of an If branch: not imported, said by name."""
    from onnx import TensorProto, helper, numpy_helper

    src, tensors, path = llama
    model = float_model(src)
    branch = helper.make_graph([helper.make_node("Identity", ["blk.0.attn_v.weight"], ["v"])], "then", [],
                               [helper.make_tensor_value_info("v", TensorProto.FLOAT, [128, 256])],
                               initializer=[numpy_helper.from_array(np.zeros((128, 256), np.float32), "blk.0.attn_v.weight")])
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    model.graph.node.append(helper.make_node("If", ["cond"], ["vv"], then_branch=branch, else_branch=branch))
    model.graph.output.append(helper.make_tensor_value_info("vv", TensorProto.FLOAT, [128, 256]))
    with pytest.raises(dyndq.ValidationError, match="weight 'blk.0.attn_v.weight'.*inside a subgraph"):
        dyndq.import_weights(model, path)


def test_lookup_tables_are_written_once_for_every_tensor_of_a_type(llama, tmp_path):
    """Two IQ4_NL tensors (drawn raw blocks: gguf has no quantizer for it) read one int8 table of 16 values."""
    from gguf_blocks import drawn
    from gguf_models import unpermute

    src, tensors, _ = llama
    two = dict(tensors)
    two["blk.0.attn_q.weight"] = ("IQ4_NL", drawn("IQ4_NL", 256, 8, seed=1))
    two["blk.0.ffn_up.weight"] = ("IQ4_NL", drawn("IQ4_NL", 256, 8, seed=2))
    write_gguf(tmp_path / "iq.gguf", two)
    out, report = dyndq.import_weights(float_model(src), tmp_path / "iq.gguf")
    tables = [t for t in out.graph.initializer if t.data_type == onnx.TensorProto.INT8 and list(t.dims) == [16]]
    assert len(tables) == 1
    from gguf_models import dequantized

    with np.errstate(all="ignore"):
        got = dyndq.run(with_outputs(out, [Q, UP]), ids())
        want = {Q: unpermute(dequantized(two, "blk.0.attn_q.weight"), 4), UP: dequantized(two, "blk.0.ffn_up.weight")}
    for name in (Q, UP):
        assert (bits(got[name]) == bits(want[name])).all(), name


def test_a_float16_weight_reads_the_decode_cast_to_float16(tmp_path):
    """The checkpoint's dequantization is float32: a float16 weight gets a Cast after it, said in the report."""
    from onnx import TensorProto, helper, numpy_helper

    from gguf_blocks import gguf, qtype

    embed = (np.random.default_rng(3).standard_normal((8, 32)) * 0.1).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["model.embed_tokens.weight", "ids"], ["h"])], "half",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT16, [2, 32])],
                              initializer=[numpy_helper.from_array(embed.astype(np.float16), "model.embed_tokens.weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    data = gguf.quants.quantize(embed, qtype("Q8_0"))
    write_gguf(tmp_path / "h.gguf", {"token_embd.weight": ("Q8_0", data)})
    out, report = dyndq.import_weights(model, tmp_path / "h.gguf")
    assert "cast to float16" in report.imported[0].note
    got = dyndq.run(out, {"ids": np.array([5, 1])})["h"]
    want = gguf.quants.dequantize(data, qtype("Q8_0")).astype(np.float16)[[5, 1]]
    assert got.dtype == np.float16 and (got.view(np.uint16) == want.view(np.uint16)).all()


def test_an_exporters_wrapper_prefix_is_looked_through_by_the_name_map(llama):
    # torch.onnx.export of a model wrapped in another module prefixes its attribute name (a
    # BertModel under `bert.`): gguf's map knows the name without it, as llama.cpp's converter strips it
    src, tensors, path = llama
    model = float_model(src, names={Q: f"wrapper.{Q}", K: f"wrapper.{K}"})
    out, report = dyndq.import_weights(model, path)
    rows = {r.weight: r for r in report.imported}
    assert rows[f"wrapper.{Q}"].how == rows[f"wrapper.{K}"].how == "by GGUF's name map", report.table()
    assert rows[f"wrapper.{Q}"].tensor == "blk.0.attn_q.weight" and rows[f"wrapper.{K}"].tensor == "blk.0.attn_k.weight"
