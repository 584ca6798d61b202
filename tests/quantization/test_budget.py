"""`quantize(model, budget=BITS)`: mixed formats under a size budget (dyndq/quantization/budget.py).

The bytes are counted from the written model's initializers; the output error is measured by
the quantizer's own evaluation (seeded random inputs, ONNX Runtime), the one the allocation
is chosen on."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model
from dyndq.plumbing.light import stored_bytes
from dyndq.quantization import OptionError

from quantize_models import heavy, mlp


def mixed(seed=0) -> onnx.ModelProto:
    """x [batch, 128] -> MatMul(A [128, 256]) -> Relu -> MatMul(B [256, 512]) -> MatMul(C [512, 64]) -> y.
    A and C are Student-t; B, as LLM layers with outlier input channels do, holds two rows 60
    times its others, one in each group of 128 rows.  B's output is then mostly those rows',
    which every width keeps well: its error at 2 bits reaches the output little (about 2x its
    4-bit one, where A's is 38x), so 8 bits for A and C paid for by 2 bits for B beats 4 bits
    everywhere."""
    b = heavy((256, 512), seed + 1)
    b[[5, 133]] *= 60
    inits = [nh.from_array(heavy((128, 256), seed), "A"), nh.from_array(b, "B"), nh.from_array(heavy((512, 64), seed + 2), "C")]
    nodes = [helper.make_node("MatMul", ["x", "A"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "B"], ["m"], name="fc2"), helper.make_node("MatMul", ["m", "C"], ["y"], name="fc3")]
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 128])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def quantized_bytes(float_model, out, report) -> int:
    """Bytes of the written model's initializers beyond the float model's weights that stayed."""
    done = {layer.name for layer in report.layers}
    kept = sum(stored_bytes(t) for t in float_model.graph.initializer if t.name not in done)
    return sum(stored_bytes(t) for t in out.graph.initializer) - kept


def elements(report) -> int:
    return sum(int(np.prod(layer.shape)) for layer in report.layers)


def output_error(report) -> float:
    return report.outputs[0].relative_error


@pytest.mark.parametrize("budget, choices", [(2.6, None), (3.5, None), (4.3, None), (6.0, None), (9.0, None),
                                             (4.4, "int2,mxfp4,nvfp4,int8"), (4.6, "nvfp4,int4")])
def test_the_written_model_holds_at_most_the_budget(budget, choices):
    """(mlp's Gemm weight is padded to whole groups, with a Slice: its bounds are counted too)"""
    model = mlp()
    out, report = dyndq.quantize(model, budget=budget, format_choices=choices)
    written = quantized_bytes(model, out, report)
    assert written == report.budget.bytes == report.bytes_after
    assert 8 * written <= budget * elements(report)
    assert dyndq.check(out) == []


def test_monotone_in_the_budget():
    model = mixed()
    runs = [dyndq.quantize(model, budget=b, method="search") for b in (2.5, 3.0, 3.6, 4.2, 5.0, 6.5, 8.3)]
    sizes = [r.bytes_after for _, r in runs]
    errors = [output_error(r) for _, r in runs]
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0] / 5 and sizes == sorted(sizes)
    assert all(8 * s <= b * elements(r) for s, (_, r), b in zip(sizes, runs, (2.5, 3.0, 3.6, 4.2, 5.0, 6.5, 8.3)))


def test_no_worse_than_uniform_4_bit_search_at_its_bytes_and_better_on_mixed_sensitivity():
    model = mixed()
    uniform, u = dyndq.quantize(model, method="search")
    bits = 8 * u.bytes_after / elements(u)
    out, report = dyndq.quantize(model, budget=bits, method="search")
    assert report.bytes_after <= u.bytes_after
    assert output_error(report) <= 0.9 * output_error(u)
    chosen = {w.name: w.candidates[w.chosen].choice for w in report.budget.weights}
    assert chosen == {"A": "int8", "B": "int2", "C": "int8"}  # (B, whose error reaches the output least, pays)


def test_no_worse_than_uniform_where_layers_are_alike():
    model = mlp()
    _, u = dyndq.quantize(model, method="search")
    _, report = dyndq.quantize(model, budget=8 * u.bytes_after / elements(u), method="search")
    assert report.bytes_after <= u.bytes_after and output_error(report) <= output_error(u)


def test_fp4_choices_and_the_dynamic_dequantize_version():
    model = mixed()
    out, report = dyndq.quantize(model, budget=4.6, format_choices="int2,mxfp4,nvfp4,int8")
    choices = {w.candidates[w.chosen].choice for w in report.budget.weights}
    assert choices <= {"int2", "mxfp4", "nvfp4", "int8"}
    assert all([c.choice for c in w.candidates] == ["int2", "mxfp4", "nvfp4", "int8"] for w in report.budget.weights)
    want = 3 if choices & {"int2", "mxfp4", "nvfp4"} else 2
    assert {o.version for o in out.opset_import if o.domain == "org.dyndq"} == {want}
    x = np.random.default_rng(3).standard_normal((2, 128)).astype(np.float32)
    ref = dyndq.run(out, {"x": x}, engine="reference")["y"]
    ort = dyndq.run(out, {"x": x}, engine="onnxruntime")["y"]
    np.testing.assert_allclose(ref, ort, rtol=1e-4, atol=1e-5)  # (float MatMuls in each engine's order)


def test_the_report_says_each_weights_choice_and_why():
    _, report = dyndq.quantize(mixed(), budget=4.3, method="search")
    lines = report.table()
    text = "\n".join(lines)
    assert "budget 4.3 bits per weight" in text and "sensitivity: the model's relative squared output error" in text
    for w in report.budget.weights:
        line = next(line for line in lines if line.strip().startswith(f"{w.name}: "))
        assert line.strip().startswith(f"{w.name}: {w.candidates[w.chosen].choice} (")
        assert w.why in line and w.why.startswith("its cheapest choice" if w.step_gain is None else "step up taken at ")
        assert all(c.choice in line for c in w.candidates)
    doc = report.as_dict()["budget"]
    assert {w["name"] for w in doc["weights"]} == {"A", "B", "C"}
    assert all(len(w["candidates"]) == 3 and w["chosen"] in ("int2", "int4", "int8") for w in doc["weights"])
    assert report.summary() == "quantized 3 weights to mixed formats (int2, int4, int8) within 4.3 bits per weight"


@pytest.mark.parametrize("kwargs, said", [
    (dict(budget=1.0), "budget: found 1 bits per weight; allowed: from 2."),
    (dict(budget=12.0), "budget: found 12 bits per weight; allowed: from 2."),
    (dict(budget=0), "budget: found 0; allowed: a number of bits per weight > 0"),
    (dict(budget=4, bits=2), "bits: found 2 with a budget; allowed: none given"),
    (dict(budget=4, bits=4), "bits: found 4 with a budget; allowed: none given"),  # (its default value, given)
    (dict(budget=4, format="int"), "format: found 'int' with a budget; allowed: none given"),
    (dict(budget=4, format_choices="int4,fp8"), "format_choices: found 'int4,fp8'"),
    (dict(format_choices="int4,int8"), "format_choices: found 'int4,int8'; allowed: none without a budget"),
])
def test_bad_budgets_say_what_is_possible(kwargs, said):
    with pytest.raises(OptionError) as e:
        dyndq.quantize(mlp(), **kwargs)
    assert said in str(e.value)


def test_cli_budget(tmp_path, capsys):
    src, dst = str(tmp_path / "float.onnx"), str(tmp_path / "q.onnx")
    save_model(mixed(), src)
    assert main(["quantize", src, dst, "--budget", "4.3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["budget"] == 4.3 and doc["budget"]["bits_per_weight"] <= 4.3
    assert 8 * doc["bytes_after"] <= 4.3 * doc["budget"]["elements"]
    assert main(["quantize", src, dst, "--budget", "4.3", "--format-choices", "int2,int8"]) == 0
    printed = capsys.readouterr().out
    assert "within 4.3 bits per weight" in printed.splitlines()[0] and "  budget 4.3 bits per weight" in printed


def test_cli_budget_out_of_range(tmp_path, capsys):
    src, dst = str(tmp_path / "float.onnx"), str(tmp_path / "q.onnx")
    save_model(mixed(), src)
    assert main(["quantize", src, dst, "--budget", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "dyndq: --budget: found 1.5 bits per weight; allowed: from 2." in err and "Traceback" not in err
    assert "(every weight at its cheapest of int2,int4,int8) to 8." in err
    assert not os.path.exists(dst)


def two_branches() -> onnx.ModelProto:
    """y = a @ P + b @ Q: two alike weights, each on an input of its own."""
    inits = [nh.from_array(heavy((128, 64), 0), "P"), nh.from_array(heavy((128, 64), 1), "Q")]
    nodes = [helper.make_node("MatMul", ["a", "P"], ["pa"], name="p"), helper.make_node("MatMul", ["b", "Q"], ["qb"], name="q"),
             helper.make_node("Add", ["pa", "qb"], ["y"], name="add")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info(n, T.FLOAT, ["batch", 128]) for n in "ab"],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_users_inputs_choose_the_widths(tmp_path, capsys):
    """Where the user's inputs leave b at 0, Q's error never reaches the output: Q gets 2 bits, P 8."""
    rng = np.random.default_rng(0)
    feeds = [{"a": rng.standard_normal((3, 128)).astype(np.float32), "b": np.zeros((3, 128), np.float32)}]
    _, report = dyndq.quantize(two_branches(), budget=5.3, inputs=feeds)
    chosen = {w.name: w.candidates[w.chosen].choice for w in report.budget.weights}
    assert chosen == {"P": "int8", "Q": "int2"} and "the evaluation's 1 samples" in report.budget.sensitivity
    _, seeded = dyndq.quantize(two_branches(), budget=5.3)  # (seeded samples: both branches alike)
    assert {w.candidates[w.chosen].choice for w in seeded.budget.weights} != {"int8", "int2"}
    src, dst = str(tmp_path / "two.onnx"), str(tmp_path / "q.onnx")
    save_model(two_branches(), src)
    np.save(tmp_path / "a.npy", feeds[0]["a"])
    np.save(tmp_path / "b.npy", feeds[0]["b"])
    assert main(["quantize", src, dst, "--budget", "5.3", "--input", f"a={tmp_path / 'a.npy'}",
                 "--input", f"b={tmp_path / 'b.npy'}", "--no-evaluate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {w["name"]: w["chosen"] for w in doc["budget"]["weights"]} == {"P": "int8", "Q": "int2"}


def test_ranked_methods_choose_their_widths_on_the_users_inputs():
    rng = np.random.default_rng(0)
    feeds = [{"a": rng.standard_normal((3, 128)).astype(np.float32), "b": np.zeros((3, 128), np.float32)}]
    for method, report in dyndq.quantization.rank_methods(two_branches(), budget=5.3, inputs=feeds):
        chosen = {w.name: w.candidates[w.chosen].choice for w in report.budget.weights}
        assert chosen == {"P": "int8", "Q": "int2"}, method


def test_constant_node_weights_are_measured_as_initializers_are():
    """An exporter's model holds its weights in Constant nodes (paddle2onnx, torch's): they are fed
    to the sensitivity runs as the initializers are, and the widths chosen are the same."""
    model = mixed()
    as_constants = onnx.ModelProto()
    as_constants.CopyFrom(model)
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in as_constants.graph.initializer]
    del as_constants.graph.initializer[:]
    nodes = constants + list(as_constants.graph.node)
    del as_constants.graph.node[:]
    as_constants.graph.node.extend(nodes)
    _, a = dyndq.quantize(model, budget=4.3, method="search")
    _, b = dyndq.quantize(as_constants, budget=4.3, method="search")
    assert "reconstruction error" not in b.budget.sensitivity
    assert [w.candidates[w.chosen].choice for w in b.budget.weights] == [w.candidates[w.chosen].choice for w in a.budget.weights]
    assert [c.error for w in b.budget.weights for c in w.candidates] == [c.error for w in a.budget.weights for c in w.candidates]


def test_a_model_with_external_data(tmp_path, capsys):
    """Read without its data, the weights one at a time: the sensitivity runs still see every weight."""
    save_model(mixed(), tmp_path / "float.onnx", external_data=True)
    assert main(["quantize", str(tmp_path / "float.onnx"), str(tmp_path / "q.onnx"), "--budget", "4.3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "reconstruction error" not in doc["budget"]["sensitivity"] and doc["data_file"] == "q.onnx.data"
    _, in_memory = dyndq.quantize(mixed(), budget=4.3)
    assert [w["chosen"] for w in doc["budget"]["weights"]] == [w.candidates[w.chosen].choice for w in in_memory.budget.weights]
