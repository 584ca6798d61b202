"""The calibration in passes (dyndq/quantization/calibration.py): the layers' inputs split into
groups whose statistics fit `calibration_memory`, a pass over the samples each, the codes bit
for bit those of one pass; the bound's checks; the shared runner the passes run on
(evaluate.OnOrt with `outputs`)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper as nh, TensorProto as T

import dyndq
from dyndq.cli import main
from dyndq.quantization.activations import ActivationStats, LayerInput, layer_inputs
from dyndq.quantization.calibration import default_bound, grouped, walker_order
from dyndq.quantization.options import OptionError, byte_size
from dyndq.quantization.plan import plan


def stack(seed: int = 0) -> onnx.ModelProto:
    """x [m, 64] -> three weights reading x (q, k, v: one input), their sum -> Relu -> up [64, 96]
    -> Relu -> down [96, 128] -> Relu -> out [128, 48]: four distinct inputs of K 64, 64, 96, 128;
    its initializers listed out of the nodes' order (the walker's order is theirs)."""
    rng = np.random.default_rng(seed)
    shapes = {"Wq": (64, 64), "Wk": (64, 64), "Wv": (64, 64), "Wup": (64, 96), "Wdown": (96, 128), "Wout": (128, 48)}
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"]), helper.make_node("MatMul", ["x", "Wk"], ["k"]),
             helper.make_node("MatMul", ["x", "Wv"], ["v"]), helper.make_node("Sum", ["q", "k", "v"], ["s"]),
             helper.make_node("Relu", ["s"], ["r0"]), helper.make_node("MatMul", ["r0", "Wup"], ["u"]),
             helper.make_node("Relu", ["u"], ["r1"]), helper.make_node("MatMul", ["r1", "Wdown"], ["d"]),
             helper.make_node("Relu", ["d"], ["r2"]), helper.make_node("MatMul", ["r2", "Wout"], ["y"])]
    order = ["Wup", "Wq", "Wk", "Wv", "Wdown", "Wout"]
    inits = [nh.from_array((rng.standard_normal(shapes[n]) / np.sqrt(shapes[n][0])).astype(np.float32), n)
             for n in order]
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", T.FLOAT, ["m", 64])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["m", 48])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def samples(count=3, rows=40, seed=10):
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((64, 64)) / 8 + np.eye(64)
    return [{"x": (rng.standard_normal((rows, 64)) @ mix).astype(np.float32)} for _ in range(count)]


def stats_bytes(k: int) -> int:
    return 8 * (k * k + 2 * k)


def test_several_passes_give_one_passs_codes_scales_and_zero_points_bit_for_bit():
    """A bound of one weight's statistics (the down projection's input, K = 128) splits the four
    inputs into passes; every initializer written (codes, scales, zero points) is one pass's, byte
    for byte, symmetric and not, with act order; the notes say the passes and the statistics held."""
    model = stack()
    feeds = samples()
    before = model.SerializeToString()
    for options in (dict(), dict(symmetric=True, act_order=True, group_size=32)):
        one, one_report = dyndq.quantize(model, method="gptq", inputs=feeds, evaluate=False,
                                         calibration_memory="1GiB", **options)
        many, many_report = dyndq.quantize(model, method="gptq", inputs=feeds, evaluate=False,
                                           calibration_memory=stats_bytes(128), **options)
        assert model.SerializeToString() == before
        got = {t.name: nh.to_array(t) for t in many.graph.initializer}
        want = {t.name: nh.to_array(t) for t in one.graph.initializer}
        assert sorted(got) == sorted(want) and len(want) >= 12
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name].view(np.uint8), want[name].view(np.uint8), err_msg=name)
        one_note = next(n for n in one_report.notes if "collected in" in n)
        many_note = next(n for n in many_report.notes if "collected in" in n)
        assert one_note.startswith("the layers' inputs collected in 1 pass over the samples (3 ONNX Runtime runs")
        # (walker order Wup, Wq, Wk, Wv, Wdown, Wout: {r0, x}, {r1}, {r2} within 128 K's statistics)
        assert many_note.startswith("the layers' inputs collected in 3 passes over the samples (9 ONNX Runtime runs")
        assert f"at most {stats_bytes(128) / 2**20:.1f} MiB of statistics held at once (--calibration-memory" in many_note
        assert f"every layer's at once: {(2 * stats_bytes(64) + stats_bytes(96) + stats_bytes(128)) / 2**20:.1f} MiB" \
            in many_note


def test_the_groups_follow_the_walkers_order_and_keep_a_shared_input_whole():
    """The weights come as the model lists its initializers; q, k and v's one input is one group's,
    never split; each group's statistics fit the bound."""
    model = stack()
    inputs, _ = layer_inputs(model, plan(model, ops=("MatMul",), exclude=()).targets)
    keys = walker_order(model, inputs)
    assert [name for _, name in keys] == ["Wup", "Wq", "Wk", "Wv", "Wdown", "Wout"]
    ordered = {key: inputs[key] for key in keys}
    x, r0, r1, r2 = LayerInput("x", 64), LayerInput("r0", 64), LayerInput("r1", 96), LayerInput("r2", 128)
    assert grouped(ordered, stats_bytes(128)) == [[r0, x], [r1], [r2]]
    assert grouped(ordered, 2 * stats_bytes(64) + stats_bytes(96)) == [[r0, x, r1], [r2]]
    assert grouped(ordered, 10**9) == [[r0, x, r1, r2]]
    for bound in (stats_bytes(128), 300_000):
        for group in grouped(ordered, bound):
            assert sum(ActivationStats.bytes_for(i.k) for i in group) <= bound


def test_the_default_bound_is_a_quarter_of_the_weights_or_one_weights_statistics():
    model = stack()
    inputs, _ = layer_inputs(model, plan(model, ops=("MatMul",), exclude=()).targets)
    weights = sum(4 * int(np.prod(t.dims)) for t in model.graph.initializer)
    assert default_bound(model, inputs) == max(weights // 4, stats_bytes(128))
    # (one weight's statistics when they are more: K = 128 -> 133 kB, the weights 4x 29 kB)
    small = stack()
    for t in small.graph.initializer:
        t.CopyFrom(nh.from_array(nh.to_array(t)[:, :1].copy(), t.name))
    assert default_bound(small, layer_inputs(small, plan(small, ops=("MatMul",), exclude=()).targets)[0]) \
        == stats_bytes(128)


def test_statistics_are_dropped_once_their_weights_are_quantized():
    """After the walker, no statistics are held; while quantizing, at most the bound's worth."""
    from dyndq.quantization import calibration

    seen = []
    original = calibration.Passes.done

    def done(self, key):
        original(self, key)
        seen.append(sum(ActivationStats.bytes_for(i.k) for i in self.held))

    model = stack()
    try:
        calibration.Passes.done = done
        dyndq.quantize(model, method="gptq", inputs=samples(), evaluate=False, calibration_memory=stats_bytes(128))
    finally:
        calibration.Passes.done = original
    assert len(seen) == 6 and seen[-1] == 0 and max(seen) <= stats_bytes(128)


@pytest.mark.parametrize("value,found", [
    (0, "0"), (-3, "-3"), ("12XB", "'12XB'"), ("", "''"), (True, "True"), (1.5, "1.5"), ("0MiB", "'0MiB'")])
def test_a_bad_bound_is_named(value, found):
    with pytest.raises(OptionError) as e:
        dyndq.quantize(stack(), method="gptq", calibration_memory=value, evaluate=False)
    assert [(p.argument, p.found) for p in e.value.problems] == [("calibration_memory", found)]
    assert "a number of bytes >= 1" in e.value.problems[0].allowed


def test_a_bound_with_a_data_free_method_or_below_one_weights_statistics_is_named():
    with pytest.raises(OptionError) as e:
        dyndq.quantize(stack(), method="rtn", calibration_memory="1MiB", evaluate=False)
    assert [(p.argument, p.found) for p in e.value.problems] == [("calibration_memory", "'1MiB' with method 'rtn'")]
    with pytest.raises(OptionError) as e:
        dyndq.quantize(stack(), method="gptq", calibration_memory=1000, inputs=samples(), evaluate=False)
    (problem,) = e.value.problems
    assert problem.argument == "calibration_memory" and problem.found == "1000 bytes (0.0 MiB)"
    assert problem.allowed.startswith(f"at least {stats_bytes(128)} bytes (0.1 MiB): the statistics of weight 'Wout'")


def test_byte_sizes():
    assert [byte_size(v) for v in ("512MiB", "2GB", "1.5 kB", "4096", " 3 gib ", 7)] == \
        [512 * 2**20, 2 * 10**9, 1500, 4096, 3 * 2**30, 7]
    assert [byte_size(v) for v in ("1e3", "MiB", "-1KiB", None, 2.0)] == [None] * 5


def test_the_cli_takes_a_size_and_names_a_bad_one(tmp_path, capsys):
    import json

    onnx.save(stack(), tmp_path / "f.onnx")
    for i, feeds in enumerate(samples(2)):
        (tmp_path / f"s{i}").mkdir()
        np.save(tmp_path / f"s{i}" / "x.npy", feeds["x"])
    dirs = ["--inputs-dir", str(tmp_path / "s0"), "--inputs-dir", str(tmp_path / "s1")]
    assert main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--method", "gptq",
                 "--calibration-memory", "0.14MB", "--no-evaluate", "--json", *dirs]) == 0
    report = json.loads(capsys.readouterr().out)
    # (not among the settings: the model is the same whatever the bound)
    assert "calibration_memory" not in report["settings"]
    assert any("collected in 3 passes over the samples (6 ONNX Runtime runs" in n
               and "(--calibration-memory 0.1 MiB;" in n for n in report["notes"])
    assert main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q2.onnx"), "--method", "gptq",
                 "--calibration-memory", "lots", *dirs]) == 2
    err = capsys.readouterr().err
    assert "--calibration-memory: found 'lots'" in err and "512MiB" in err and "Traceback" not in err
    assert not (tmp_path / "q2.onnx").exists()


# -- the shared runner ----------------------------------------------------------------------------

def test_the_float_model_on_onnx_runtime_gives_the_values_asked_for():
    """evaluate.OnOrt(model, outputs=...): a big weight fed apart (over 1 MiB) or the model exported
    whole (a function in it), the values asked for are dyndq.run's on ONNX Runtime, bit for bit,
    the feeds checked against the model's own inputs; the model is not changed."""
    from dyndq.quantization.evaluate import OnOrt
    from dyndq.runner import FeedError

    k, n = 640, 512  # (1.25 MiB of float32)
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "V"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["m", 8])],
                          [nh.from_array(rng.standard_normal((k, n)).astype(np.float32), "W"),
                           nh.from_array(rng.standard_normal((n, 8)).astype(np.float32), "V")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    feeds = {"x": rng.standard_normal((5, k)).astype(np.float32)}
    before = model.SerializeToString()
    run = OnOrt(model, outputs={"h": "float32", "r": "float32"})
    got = run(feeds)
    want = dyndq.run(model, feeds, engine="onnxruntime", outputs=["h", "r"])
    assert list(got) == ["h", "r"] and model.SerializeToString() == before
    for name in ("h", "r"):
        np.testing.assert_array_equal(got[name].view(np.uint32), want[name].view(np.uint32))
    with pytest.raises(FeedError):
        run({"W": feeds["x"]})  # (the weights fed apart are not the model's inputs)
    # (a model the export rewrites: exported whole, the value still given)
    f = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                             [helper.make_opsetid("", 21)])
    fn_model = helper.make_model(helper.make_graph(
        [helper.make_node("Twice", ["x"], ["t"], domain="local"), helper.make_node("MatMul", ["t", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["m", k])], [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((k, 8)).astype(np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)], functions=[f], ir_version=10)
    got = OnOrt(fn_model, outputs={"t": "float32"})(feeds)
    np.testing.assert_array_equal(got["t"], feeds["x"] + feeds["x"])


def wide(seed: int = 3) -> onnx.ModelProto:
    """x [m, 512] -> W1 [512, 640] (1.25 MiB: over plumbing.light.BIG, fed apart) -> Relu -> W2 [640, 16]."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array((rng.standard_normal((512, 640)) / 23).astype(np.float32), "W1"),
             nh.from_array((rng.standard_normal((640, 16)) / 25).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"])]
    g = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", T.FLOAT, ["m", 512])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["m", 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_big_weights_are_fed_mapped_from_one_file_with_the_same_statistics_bit_for_bit():
    """A pass feeds the weights over BIG mapped from the calibration's file (not read again), and the
    statistics are those of the weights read into memory, bit for bit; close() removes the file."""
    import os

    from dyndq.quantization.activations import MappedWeights, collect

    model = wide()
    feeds = [{"x": np.random.default_rng(i).standard_normal((20, 512)).astype(np.float32)} for i in range(2)]
    wanted = [LayerInput("r", 640)]
    mapped = MappedWeights(model)
    arrays = mapped.arrays()
    assert list(arrays) == ["W1"] and isinstance(arrays["W1"], np.memmap)
    np.testing.assert_array_equal(arrays["W1"], nh.to_array(model.graph.initializer[0]))
    del arrays
    read = collect(model, wanted, feeds)[wanted[0]]
    fed = collect(model, wanted, feeds, mapped=mapped)[wanted[0]]
    assert np.array_equal(read.gram, fed.gram) and np.array_equal(read.abs_sum, fed.abs_sum)
    mapped.close()
    assert not os.path.exists(mapped.path)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_awq_and_gptq_drop_every_statistic_and_the_mapped_file_by_the_end(method):
    """awq without scale estimation drops its statistics as the walker goes too (it never asked
    for them there), and the mapped weights' file is gone once quantize returns."""
    import os

    from dyndq.quantization import activations, calibration

    seen, paths = [], []
    done, made = calibration.Passes.done, activations.MappedWeights.__init__

    def watched_done(self, key):
        done(self, key)
        seen.append(sum(ActivationStats.bytes_for(i.k) for i in self.held))

    def watched_init(self, *a, **k):
        made(self, *a, **k)
        paths.append(self.path)

    try:
        calibration.Passes.done, activations.MappedWeights.__init__ = watched_done, watched_init
        dyndq.quantize(wide(), method=method, inputs=[{"x": np.ones((4, 512), np.float32)}], evaluate=False)
    finally:
        calibration.Passes.done, activations.MappedWeights.__init__ = done, made
    assert len(seen) == 2 and seen[-1] == 0
    assert paths and not any(os.path.exists(p) for p in paths)
