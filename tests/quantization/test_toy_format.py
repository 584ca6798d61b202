"""A made-up quantization format, registered from this test, goes through every generic path.

`toy`: int8 codes with one float32 scale per weight (max|W| / 127), written as one
DynamicDequantize-2 node per_tensor; float32 weights only.  It is one class and one `register`
call, as docs/house.md's "Adding a quantization format" says a format is: its option checks
(the data it declares, and `fits`), its quantize, its dequantize for the budget and the nodes it
writes.  Nothing in dyndq/ names it; if the quantizer, the options, the budget, the report or
the CLI still assumed the formats they were written with, one of these tests would fail.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.cli import main
from dyndq.opdefs import Problem
from dyndq.quantization import OptionError, formats, quantize_file
from dyndq.quantization.numerics import ErrorStats, QuantizedWeight
from dyndq.quantization.rewrite import Placed

from quantize_models import heavy, mlp


class Toy(formats.Format):
    name = "toy"
    summary = "int8 codes, one float32 scale per weight"
    bits = (8,)
    codes_words = "int8 per tensor"
    scales_words = "one float32 per weight"
    choices = {"toy8": 8}

    def fits(self, options, targets):
        return [Problem("format", f"'toy' for the {t.dtype} weight {t.name!r}", "float32 weights only")
                for t in targets if t.dtype != "float32"]

    def quantize(self, weight, target, options, bits):
        scale = np.float32(np.abs(weight).max() / 127) or np.float32(1)
        codes = np.clip(np.rint(weight / scale), -127, 127).astype(np.int8)
        stats = ErrorStats()
        stats.add(weight, codes.astype(np.float32) * scale)
        length = weight.shape[target.axis]
        return QuantizedWeight(codes, np.array([scale], np.float32), None, target.axis, length, length, stats,
                               format=self.name)

    def dequantize(self, q, dtype):
        return (q.codes.astype(np.float32) * q.scales[0]).astype(dtype)

    def nodes(self, name, dtype, q, names, opset):
        codes, scale, out = names.fresh(f"{name}_toy_codes"), names.fresh(f"{name}_toy_scale"), names.fresh(f"{name}_toy")
        node = dyndq.make_node([codes, scale], [out], name=names.fresh(f"{name}_DynamicDequantize"), version=2,
                               qtype="per_tensor")
        return Placed([node], [nh.from_array(q.codes, codes), nh.from_array(q.scales, scale)], out, "toy per_tensor")


@pytest.fixture
def toy():
    with formats.scope():
        yield formats.register(Toy())


def test_a_format_registered_from_outside_quantizes_and_runs_on_both_engines(toy):
    model = mlp(k=64, n=32, vocab=16)
    out, report = dyndq.quantize(model, format="toy", evaluate=False)
    assert [layer.form for layer in report.layers] == ["toy per_tensor"] * 3
    assert report.summary() == "quantized 3 weights to toy"
    assert dyndq.check(out) == []
    ids = {"ids": np.arange(16, dtype=np.int64)}
    weights = {t.name: nh.to_array(t) for t in model.graph.initializer}
    e = toy.dequantize(toy.quantize(weights["E"], type("T", (), {"axis": 1})(), None, 8), np.float32)
    for engine in ("reference", "onnxruntime"):
        got = dyndq.run(out, ids, engine=engine)["y"]
        h = np.maximum(e @ toy.dequantize(toy.quantize(weights["W1"], type("T", (), {"axis": 0})(), None, 8),
                                          np.float32), 0)
        w2 = toy.dequantize(toy.quantize(weights["W2"], type("T", (), {"axis": 1})(), None, 8), np.float32)
        np.testing.assert_allclose(got, h @ w2.T, rtol=1e-4, atol=1e-5)


def test_its_option_checks_are_its_own(toy):
    model = mlp(k=64, n=32, vocab=16)
    with pytest.raises(OptionError) as e:
        dyndq.quantize(model, format="toy", bits=4, scale_dtype="float16", method="search", evaluate=False)
    assert [str(p) for p in e.value.problems] == [
        "bits: found 4 with format 'toy'; allowed: 8 (its codes are int8 per tensor) or none given",
        "scale_dtype: found 'float16' with format 'toy'; allowed: none (its scales are one float32 per weight)",
        "method: found 'search' with format 'toy'; allowed: 'rtn' (the format's rule is the only method)"]
    with pytest.raises(OptionError) as e:  # (its `fits`, on the weights found)
        dyndq.quantize(mlp(k=64, n=32, vocab=16, dtype=np.float16), format="toy", evaluate=False)
    assert "float32 weights only" in str(e.value.problems[0])


def test_a_budget_chooses_among_its_choices(toy):
    model = mlp(k=256, n=128, vocab=32)
    out, report = dyndq.quantize(model, budget=6, format_choices="int4,toy8", evaluate=False)
    assert all([c.choice for c in w.candidates] == ["int4", "toy8"] for w in report.budget.weights)
    chosen = {w.candidates[w.chosen].choice for w in report.budget.weights}
    assert "toy8" in chosen and report.budget.bits_per_weight <= 6
    assert dyndq.check(out) == []


@pytest.mark.parametrize("emit", ["dyndq", "onnx", "onnxruntime"])
def test_it_is_written_in_every_form_and_the_cli_takes_it(toy, tmp_path, emit, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(mlp(k=64, n=32, vocab=16), src)
    report = quantize_file(src, tmp_path / "q.onnx", emit=emit, format="toy")
    assert report.layers and report.outputs[0].relative_error < 0.05
    assert main(["quantize", str(src), str(tmp_path / "c.onnx"), "--format", "toy", "--emit", emit, "--no-evaluate"]) == 0
    assert "toy per_tensor" in capsys.readouterr().out


def test_the_cli_help_says_each_format_and_width_from_the_registry(toy, capsys):
    class Wide(Toy):  # a format of several widths: --bits' help names them, its default first in `bits`
        name, bits, choices = "wide", (3, 6), {}

    formats.register(Wide())
    assert main(["quantize", "--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "toy: int8 codes, one float32 scale per weight" in said
    assert "3 (default) or 6 (--format wide)" in said and "2, 4 (default) or 8 (--format int)" in said


def test_out_of_its_scope_the_format_is_unknown():
    with formats.scope():
        formats.register(Toy())
        assert "toy" in formats.names() and "toy8" in formats.choices()
    assert "toy" not in formats.names()
    w = heavy((64, 8))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 8])], [nh.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(OptionError) as e:
        dyndq.quantize(model, format="toy")
    assert [p.argument for p in e.value.problems] == ["format"]
    with pytest.raises(ValueError):  # (a name taken is refused)
        formats.register(type("Again", (Toy,), {"name": "int"})())
