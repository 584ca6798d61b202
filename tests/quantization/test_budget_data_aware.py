"""`quantize(model, budget=BITS, method=gptq|awq, scale_estimation=...)`: a budget whose candidates are
made by the data-aware method (budget.calibrated_candidates), calibrated once."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.cli import main
from dyndq.quantization import awq as awq_module
from quantize_models import with_float_weights

OPSET = 21
K, N = 64, 48
GROUP, BUDGET = 32, 5.0  # (on mixed_model: Wa at int4, Wb at int2, Wc at int4 whatever the method)


def mixed_model(seed=0) -> onnx.ModelProto:
    """x -> LayerNormalization -> h; h -> MatMul Wa -> a (large) and MatMul Wb -> b (tiny: its error
    hardly counts); a -> Relu -> MatMul Wc -> c.  Outputs b and c: Wa and Wb share one X but not one
    sensitivity, so a budget gives them different widths."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 2.0, K).astype(np.float32)
    gamma[rng.choice(K, 4, replace=False)] *= 20  # (salient channels: awq's alpha is not 0)
    inits = dict(gamma=gamma, beta=(rng.standard_normal(K) * 0.1).astype(np.float32),
                 Wa=(rng.standard_normal((K, N)) * 0.1).astype(np.float32),
                 Wb=(rng.standard_normal((K, N)) * 0.002).astype(np.float32),
                 Wc=(rng.standard_normal((N, 32)) * 0.1).astype(np.float32))
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
             helper.make_node("MatMul", ["h", "Wa"], ["a"], name="fa"),
             helper.make_node("MatMul", ["h", "Wb"], ["b"], name="fb"),
             helper.make_node("Relu", ["a"], ["ra"], name="relu"),
             helper.make_node("MatMul", ["ra", "Wc"], ["c"], name="fc")]
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", K])],
                          [helper.make_tensor_value_info("b", T.FLOAT, ["batch", N]),
                           helper.make_tensor_value_info("c", T.FLOAT, ["batch", 32])],
                          [nh.from_array(a, name) for name, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)


def feeds(seed=1, rows=96, parts=3) -> list[dict]:
    x = np.random.default_rng(seed).standard_normal((rows, K)).astype(np.float32)
    return [{"x": p} for p in np.array_split(x, parts)]


def written(model: onnx.ModelProto, name: str) -> dict[str, np.ndarray]:
    """The weight's codes, scales and zero points as written (by their names' suffixes)."""
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    return {s: inits[f"{name}_{s}"] for s in ("quantized", "scales", "zero_points") if f"{name}_{s}" in inits}


def chosen_bits(report) -> dict[str, int]:
    return {w.name: int(w.candidates[w.chosen].choice.removeprefix("int")) for w in report.budget.weights}


METHODS = [dict(method="gptq"), dict(method="gptq", scale_estimation=True), dict(method="awq"),
           dict(method="awq", scale_estimation=True), dict(method="search", scale_estimation=True),
           dict(method="rtn", scale_estimation=True)]


@pytest.mark.parametrize("kwargs", METHODS, ids=lambda k: k["method"] + ("+se" if "scale_estimation" in k else ""))
def test_each_weights_codes_are_the_methods_alone_at_the_width_chosen(kwargs):
    model, data = mixed_model(), feeds()
    out, report = dyndq.quantize(model, budget=BUDGET, group_size=GROUP, inputs=data, evaluate=False, **kwargs)
    bits = chosen_bits(report)
    assert len(set(bits.values())) > 1, bits  # (a mixed allocation: the test means something)
    for w in report.budget.weights:
        c = w.candidates[w.chosen]
        assert c.method.startswith(kwargs["method"] + (" + scale estimation" if "scale_estimation" in kwargs else "")), c.method
    for name, b in bits.items():
        alone, _ = dyndq.quantize(model, bits=b, group_size=GROUP, inputs=data, evaluate=False, **kwargs)
        got, want = written(out, name), written(alone, name)
        assert got.keys() == want.keys()
        for part in want:  # (bit for bit: the arrays' bytes)
            assert got[part].dtype == want[part].dtype and got[part].tobytes() == want[part].tobytes(), (name, b, part)
    assert any(f"{name}: int{b} by {kwargs['method']}" in line for line in report.budget.lines() for name, b in bits.items())


@pytest.mark.parametrize("kwargs", METHODS, ids=lambda k: k["method"] + ("+se" if "scale_estimation" in k else ""))
def test_the_activations_are_collected_once_for_every_candidate(kwargs, monkeypatch):
    """Each layer input's statistics are collected once (one pass holds them) for every width of every
    weight reading it, within a bound of one weight's statistics (two passes); and in no more passes than the method alone."""
    from dyndq.quantization import calibration

    collected = []
    collect = calibration.collect

    def counted(model, wanted, *args, **kwargs):
        collected.extend(i.value for i in wanted)
        return collect(model, wanted, *args, **kwargs)

    monkeypatch.setattr(calibration, "collect", counted)
    model, data = mixed_model(), feeds()

    def passes(report):
        line = next(n for n in report.notes if "collected in" in n)
        return int(line.split("collected in ")[1].split(" pass")[0])

    _, budgeted = dyndq.quantize(model, budget=BUDGET, group_size=GROUP, inputs=data, evaluate=False,
                                 calibration_memory=8 * K * K + 16 * K, **kwargs)
    assert sorted(collected) == ["h", "ra"], collected
    _, alone = dyndq.quantize(model, bits=4, group_size=GROUP, inputs=data, evaluate=False,
                              calibration_memory=8 * K * K + 16 * K, **kwargs)
    assert passes(budgeted) <= passes(alone)


def test_awq_with_a_budget_puts_each_widths_own_scale_in_a_mul_before_its_readers(monkeypatch):
    """Wa and Wb share X = h; chosen at different widths, each reader is fed h times the r awq alone
    searches at its width (one Mul per width), and the model computes X diag(r) Q(W / r)."""
    model, data = mixed_model(), feeds()
    out, report = dyndq.quantize(model, budget=BUDGET, method="awq", group_size=GROUP, inputs=data, evaluate=False)
    bits = chosen_bits(report)
    assert bits["Wa"] != bits["Wb"], bits
    seen = []
    build = awq_module.Scaling.build.__func__
    monkeypatch.setattr(awq_module.Scaling, "build",
                        classmethod(lambda cls, *a, **k: seen.append(build(cls, *a, **k)) or seen[-1]))
    inits = {t.name: nh.to_array(t) for t in out.graph.initializer}
    muls = {n.output[0]: n for n in out.graph.node if n.op_type == "Mul"}
    for name, reader in (("Wa", "fa"), ("Wb", "fb")):
        dyndq.quantize(model, bits=bits[name], method="awq", group_size=GROUP, inputs=data, evaluate=False)
        r = seen[-1].rows[("main", name)]
        node = next(n for n in out.graph.node if n.name == reader)
        mul = muls[node.input[0]]
        assert mul.input[0] == "h"
        np.testing.assert_array_equal(inits[mul.input[1]], r.astype(np.float32))
    readers = {n.name: n.input[0] for n in out.graph.node}
    assert readers["fa"] != readers["fb"]  # (two Muls on h: one per width)
    assert "LayerNormalization" in [n.op_type for n in out.graph.node]
    assert np.array_equal(inits["gamma"], nh.to_array(next(t for t in model.graph.initializer if t.name == "gamma")))
    assert sum("awq with a budget" in n for n in report.notes) == len(muls)
    # the wiring: each quantized weight replaced by its float weight divided by the r awq alone gives it at
    # its width (scaled, not rounded), the written graph computes the float model's outputs
    dyndq.quantize(model, bits=bits["Wc"], method="awq", group_size=GROUP, inputs=data, evaluate=False)
    rows = {"Wc": seen[-1].rows.get(("main", "Wc"))}
    for name in ("Wa", "Wb"):
        dyndq.quantize(model, bits=bits[name], method="awq", group_size=GROUP, inputs=data, evaluate=False)
        rows[name] = seen[-1].rows[("main", name)]
    weights = {t.name: nh.to_array(t) for t in model.graph.initializer}
    f = with_float_weights(out, {f"{name}_dequantized": awq_module.scaled_weight(weights[name], 0, r)
                                 for name, r in rows.items()}, model.opset_import)
    feed = feeds(seed=9, parts=1)[0]
    for got, want in zip(_ort(f, feed), _ort(model, feed)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    runs = [dyndq.run(out, feed, engine=e) for e in ("reference", "onnxruntime")]
    for name in runs[0]:
        np.testing.assert_allclose(runs[0][name], runs[1][name], rtol=1e-5, atol=1e-5 * np.abs(runs[1][name]).max())


def _ort(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def test_an_fp4_choice_is_made_by_its_formats_rule_and_said_so():
    model, data = mixed_model(), feeds()
    _, report = dyndq.quantize(model, budget=BUDGET, method="gptq", format_choices="int2,mxfp4,int8", inputs=data,
                               evaluate=False)
    for w in report.budget.weights:
        methods = {c.choice: c.method for c in w.candidates}
        assert methods["mxfp4"].startswith("its format's rule") and methods["int8"].startswith("gptq"), methods
    assert "by its format's rule" in "\n".join(report.budget.lines()) or \
        all(w.candidates[w.chosen].choice != "mxfp4" for w in report.budget.weights)
    assert report.budget.as_dict()["weights"][0]["method"]


def test_the_cli_takes_a_budget_with_gptq_and_scale_estimation(tmp_path, capsys):
    """`dyndq quantize --budget 4.5 --method gptq --scale-estimation`: the codes are the API's, the JSON
    report names each weight's method and width."""
    import json

    model, data = mixed_model(), feeds()
    onnx.save(model, tmp_path / "f.onnx")
    dirs = []
    for i, f in enumerate(data):
        (tmp_path / f"s{i}").mkdir()
        np.save(tmp_path / f"s{i}" / "x.npy", f["x"])
        dirs += ["--inputs-dir", str(tmp_path / f"s{i}")]
    assert main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--budget", str(BUDGET), "--group-size", str(GROUP), "--method", "gptq",
                 "--scale-estimation", "--json", *dirs]) == 0
    said = json.loads(capsys.readouterr().out)
    weights = said["report"]["budget"]["weights"] if "report" in said else said["budget"]["weights"]
    assert {w["method"].split(" (")[0] for w in weights} == {"gptq + scale estimation"}
    api, _ = dyndq.quantize(model, budget=BUDGET, method="gptq", scale_estimation=True, group_size=GROUP, inputs=data, evaluate=False)
    cli = onnx.load(tmp_path / "q.onnx")
    for w in weights:
        got, want = written(cli, w["name"]), written(api, w["name"])
        assert all(got[p].tobytes() == want[p].tobytes() for p in want)


def test_the_benchmark_runs_small():
    """benchmarks/bench_budget_methods.py on bench_data_aware.py's synthetic MLP: a row per method, each with
    uniform int4's and the budget's held-out error and bits per weight (its timings never asserted)."""
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_budget_methods.py"
    p = subprocess.run([sys.executable, str(script), "--model", "synthetic", "--methods", "gptq+se,awq",
                        "--samples", "2", "--held-out", "2"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in p.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| method")]
    assert [r[0] for r in rows] == ["gptq + SE", "awq"], p.stdout
    for r in rows:
        assert float(r[1]) > 0 and float(r[3]) > 0 and float(r[4]) <= 4.5, r


@pytest.mark.parametrize("se", [False, True])
def test_awq_with_a_budget_that_gives_one_width_writes_awq_alones_model(se):
    """Every weight at int4 (the budget's choice here): r folded where awq alone folds it (the
    LayerNormalization's Scale and B), a Mul where it puts one, every initializer bit for bit its own."""
    model, data = mixed_model(), feeds()
    out, report = dyndq.quantize(model, budget=5.6, method="awq", scale_estimation=se, group_size=GROUP, inputs=data,
                                 evaluate=False)
    assert set(chosen_bits(report).values()) == {4}, chosen_bits(report)
    alone, _ = dyndq.quantize(model, bits=4, method="awq", scale_estimation=se, group_size=GROUP, inputs=data,
                              evaluate=False)
    got = {t.name: nh.to_array(t) for t in out.graph.initializer}
    want = {t.name: nh.to_array(t) for t in alone.graph.initializer}
    assert got.keys() == want.keys()
    assert all(got[n].dtype == want[n].dtype and got[n].tobytes() == want[n].tobytes() for n in want), \
        [n for n in want if got[n].tobytes() != want[n].tobytes()]
    assert [(n.op_type, list(n.input)) for n in out.graph.node] == [(n.op_type, list(n.input)) for n in alone.graph.node]
    assert any("folded into LayerNormalization 'ln'" in n for n in report.notes), report.notes
