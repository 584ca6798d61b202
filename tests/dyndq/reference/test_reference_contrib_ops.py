"""The reference engine on models holding ONNX Runtime's contrib ops (MatMulNBits,
GatherBlockQuantized): ONNX Runtime's own quantizer's output and the files dyndq writes itself
(`export --target onnxruntime`, `quantize --emit onnxruntime`) run through the exact lift, and
agree with ONNX Runtime with graph optimizations off: the dequantized weights to the bit (a
gathered embedding row; MatMulNBits run with A = identity(K), whose sums add zeros only), the
float outputs within parity.TOLERANCE of their largest magnitude (MatMuls summed in each
engine's own order).  A node the lift leaves alone is named, with why and the way out."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from cases import call, run_ort
from decoder import decoder_model, ort_quantize
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.parity import TOLERANCE
from dyndq.reference import NotRunnable

VOCAB = 96


def ort_off(model, feeds, outputs=None):
    """ONNX Runtime, graph optimizations off: the graph as written (`outputs`: float32 values to see)."""
    if outputs:
        model = helper.make_model(helper.make_graph(model.graph.node, "g", model.graph.input,
                                                    [helper.make_tensor_value_info(o, T.FLOAT, None) for o in outputs],
                                                    model.graph.initializer),
                                  opset_imports=list(model.opset_import), ir_version=model.ir_version)
    got = run_ort(model, feeds, level="off", outputs=outputs)
    return dict(zip(outputs or [o.name for o in model.graph.output], got))


def close(got, expected):
    return np.abs(got - expected).max() <= TOLERANCE * np.abs(expected).max()


def contrib_nodes(model, op_type):
    return [n for n in model.graph.node if n.domain == "com.microsoft" and n.op_type == op_type]


def single_matmul_nbits(model, node):
    """The node alone, its weights with it, fed A: its output is its weights when A = identity(K)."""
    used = set(node.input)
    K = next(a.i for a in node.attribute if a.name == "K")
    N = next(a.i for a in node.attribute if a.name == "N")
    alone = helper.make_node("MatMulNBits", ["A", *node.input[1:]], ["Y"], domain="com.microsoft", name=node.name,
                             **{a.name: a.i for a in node.attribute})
    graph = helper.make_graph([alone], "one", [helper.make_tensor_value_info("A", T.FLOAT, [K, K])],
                              [helper.make_tensor_value_info("Y", T.FLOAT, [K, N])],
                              [t for t in model.graph.initializer if t.name in used])
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


@pytest.mark.parametrize("bits, block, sym", [(4, 32, False), (4, 16, True), (8, 32, False)])
def test_onnxruntime_quantizer_output_runs_on_the_reference_engine(bits, block, sym):
    model = ort_quantize(decoder_model(hidden=64, layers=1, vocab=VOCAB), "QOperator", bits, block, sym)
    assert contrib_nodes(model, "MatMulNBits") and bool(contrib_nodes(model, "GatherBlockQuantized")) == (bits == 4)
    before = model.SerializeToString()
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 5))
    assert close(dyndq.run(model, {"input_ids": ids})["logits"], ort_off(model, {"input_ids": ids})["logits"])
    every_row = {"input_ids": np.arange(VOCAB)[None, :]}  # the whole embedding table, gathered
    ours = dyndq.run(model, every_row, outputs=["embedded"])["embedded"]
    theirs = ort_off(model, every_row, ["embedded"])["embedded"]
    assert ours.dtype == theirs.dtype == np.float32 and ours.tobytes() == theirs.tobytes()
    for node in contrib_nodes(model, "MatMulNBits"):
        alone = single_matmul_nbits(model, node)
        eye = {"A": np.eye(alone.graph.input[0].type.tensor_type.shape.dim[0].dim_value, dtype=np.float32)}
        assert dyndq.run(alone, eye)["Y"].tobytes() == ort_off(alone, eye)["Y"].tobytes(), node.name
    assert model.SerializeToString() == before


def test_files_dyndq_writes_for_onnxruntime_run_on_the_reference_engine(tmp_path, capsys):
    dyndq.save_model(decoder_model(hidden=64, layers=1, vocab=VOCAB), tmp_path / "float.onnx")
    ids = np.random.default_rng(2).integers(0, VOCAB, (1, 6))
    np.save(tmp_path / "ids.npy", ids)
    code, out, err = call(capsys, "quantize", tmp_path / "float.onnx", tmp_path / "q.onnx", "--group-size", "32",
                          "--no-evaluate")
    assert code == 0, err
    code, out, err = call(capsys, "export", tmp_path / "q.onnx", tmp_path / "exported.onnx", "--target", "onnxruntime")
    assert code == 0 and "MatMulNBits" in out, err
    code, out, err = call(capsys, "quantize", tmp_path / "float.onnx", tmp_path / "emitted.onnx", "--group-size", "32",
                          "--emit", "onnxruntime", "--no-evaluate")
    assert code == 0, err
    ours = dyndq.run(onnx.load(tmp_path / "q.onnx"), {"input_ids": ids})["logits"]
    for name in ("exported.onnx", "emitted.onnx"):
        written = onnx.load(tmp_path / name)
        assert contrib_nodes(written, "MatMulNBits"), name
        code, out, err = call(capsys, "run", tmp_path / name, "-i", f"input_ids={tmp_path / 'ids.npy'}",
                              "--output-dir", tmp_path / name.replace(".onnx", ""))
        assert code == 0, err
        got = np.load(tmp_path / name.replace(".onnx", "") / "logits.npy")
        assert close(got, ort_off(written, {"input_ids": ids})["logits"]), name
        assert close(got, ours), name


def quarter_zero_point_model():
    """A 2-bit MatMulNBits whose float zero points are 0.25, which no integer codes express: the
    lift leaves it alone."""
    rng = np.random.default_rng(0)
    node = helper.make_node("MatMulNBits", ["A", "B", "s", "zp"], ["Y"], name="quarter", domain="com.microsoft",
                            K=32, N=4, bits=2, block_size=16)
    inits = [nh.from_array(rng.integers(0, 256, (4, 2, 4)).astype(np.uint8), "B"), nh.from_array(np.ones((4, 2), np.float32), "s"),
             nh.from_array(np.full(8, 0.25, np.float32), "zp")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", T.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("Y", T.FLOAT, [1, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def test_a_node_the_lift_leaves_alone_is_named_with_the_way_out(tmp_path, capsys):
    model = quarter_zero_point_model()
    A = np.ones((1, 32), np.float32)
    with pytest.raises(NotRunnable) as e:
        dyndq.run(model, {"A": A})
    (problem,) = e.value.problems
    assert (problem.node, problem.op, problem.graph) == ("quarter", "com.microsoft::MatMulNBits", "main")
    assert "which the exact lift left alone: zero_points (float32) hold values that are neither integers nor half-integers" in problem.found
    assert "engine='onnxruntime'" in problem.allowed
    assert dyndq.run(model, {"A": A}, engine="onnxruntime")["Y"].shape == (1, 4)  # the way out runs it
    dyndq.save_model(model, tmp_path / "m.onnx")
    np.save(tmp_path / "A.npy", A)
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"A={tmp_path / 'A.npy'}")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "known functions" not in err, err
    assert "the reference engine cannot run this model: graph 'main' node 0 'quarter'" in err


def test_an_op_no_lift_knows_is_named():
    graph = helper.make_graph([helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft", name="gelu")], "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, [3])], [helper.make_tensor_value_info("y", T.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    with pytest.raises(NotRunnable, match="'gelu' \\(com.microsoft::FastGelu\\): found an op onnx.reference lacks, "
                                          "which no exact lift turns into DynamicDequantize"):
        dyndq.run(model, {"x": np.ones(3, np.float32)})


def test_an_output_the_lift_loses_is_named(monkeypatch):
    """A graph output that the lift no longer holds by its name is named, never replaced by another
    value (the lift is changed here to rename the MatMulNBits' output)."""
    import dyndq.lifter

    real = dyndq.lifter.lift_with_report

    def renaming(model):
        out, report = real(model)
        for n in out.graph.node:
            n.output[:] = ["Y_renamed" if o == "Y" else o for o in n.output]
        out.graph.output[0].name = "Y_renamed"
        return out, report

    monkeypatch.setattr(dyndq.lifter, "lift_with_report", renaming)
    model = ort_quantize(decoder_model(hidden=64, layers=1, vocab=VOCAB), "QOperator", 4, 32, False)
    node = contrib_nodes(model, "MatMulNBits")[0]
    alone = single_matmul_nbits(model, node)
    with pytest.raises(NotRunnable) as e:
        dyndq.run(alone, {"A": np.eye(64, dtype=np.float32)})
    (problem,) = e.value.problems
    assert problem.argument == "Y" and "removed or renamed" in problem.found and "engine='onnxruntime'" in problem.allowed
