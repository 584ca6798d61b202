"""GPTQ (dyndq/quantization/gptq.py) and the activations it is calibrated on (activations.py):
the statistics against NumPy on the same feeds, the rounding against a reference written from the
paper's equations (tests/gptq_reference.py), its output error below rtn's on
correlated inputs, `dyndq quantize --method gptq` end to end, and its bad options named."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper as nh, TensorProto as T

import dyndq
from dyndq.cli import main
from dyndq.quantization import formats
from dyndq.quantization.activations import LayerInput, collect, layer_inputs
from dyndq.quantization.gptq import GptqSettings, gptq_levels, gptq_weight
from dyndq.quantization.numerics import quantize_weight
from dyndq.quantization.options import OptionError
from dyndq.quantization.plan import plan

from gptq_reference import reference_gptq
from quantize_models import assert_same_initializers, assert_two_layers_give_back, correlated, mlp, two_layers


# -- activations ----------------------------------------------------------------------------------

def test_the_statistics_are_numpys_on_the_same_feeds():
    """X^T X, mean |x| and max |x| of each quantized MatMul's and Gemm's input, summed over samples
    of [batch] ids (Gather's output) and of the Relu's output, equal NumPy's on the same feeds
    within float32 rounding (ONNX Runtime computes the activations: relative 1e-5 of the sums);
    the model is not changed."""
    model = mlp(k=64, n=48, vocab=32)
    before = model.SerializeToString()
    found = plan(model, ops=("MatMul", "Gemm"), exclude=())
    inputs, missing = layer_inputs(model, found.targets)
    assert not missing
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 32, size=b).astype(np.int64)} for b in (5, 9, 3)]
    stats = collect(model, [i for found in inputs.values() for i in found], feeds)
    assert model.SerializeToString() == before
    arrays = {t.name: nh.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = np.concatenate([arrays["E"][f["ids"]] for f in feeds])
    relu = np.maximum(x @ arrays["W1"], 0)
    for value, rows in (("x", x), ("r", relu)):
        s = stats[LayerInput(value, 64 if value == "x" else 48, False)]
        assert s.rows == len(rows)
        np.testing.assert_allclose(s.gram, rows.T @ rows, rtol=1e-5, atol=1e-5 * np.abs(rows.T @ rows).max())
        np.testing.assert_allclose(s.mean_abs, np.abs(rows).mean(axis=0), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(s.abs_max, np.abs(rows).max(axis=0), rtol=1e-5, atol=1e-7)


def test_leading_dims_are_rows_and_a_transposed_gemm_input_its_columns():
    """An input [2, 3, k] counts as 6 rows of k; Gemm's A with transA=1 ([k, m]) as its m columns."""
    k = 8
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["a", "W"], ["y"], name="mm"),
             helper.make_node("Gemm", ["b", "V"], ["z"], name="gemm", transA=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", T.FLOAT, [2, 3, k]),
                                       helper.make_tensor_value_info("b", T.FLOAT, [k, 5])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None), helper.make_tensor_value_info("z", T.FLOAT, None)],
                          [nh.from_array(rng.standard_normal((k, 4)).astype(np.float32), "W"),
                           nh.from_array(rng.standard_normal((k, 4)).astype(np.float32), "V")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    inputs, _ = layer_inputs(model, plan(model, ops=("MatMul", "Gemm"), exclude=()).targets)
    feeds = [{"a": rng.standard_normal((2, 3, k)).astype(np.float32), "b": rng.standard_normal((k, 5)).astype(np.float32)}]
    stats = collect(model, [i for found in inputs.values() for i in found], feeds)
    a, b = feeds[0]["a"].reshape(-1, k).astype(np.float64), feeds[0]["b"].T.astype(np.float64)
    np.testing.assert_allclose(stats[LayerInput("a", k)].gram, a.T @ a, rtol=1e-12)
    np.testing.assert_allclose(stats[LayerInput("b", k, True)].gram, b.T @ b, rtol=1e-12)
    assert stats[LayerInput("a", k)].rows == 6 and stats[LayerInput("b", k, True)].rows == 5


def test_a_big_weight_is_fed_apart_and_the_next_layers_input_still_collected():
    """A weight over 1 MiB is fed to ONNX Runtime as an array held once (evaluate.OnOrt's way), the
    feeds still checked against the model's own inputs: the input of the MatMul after it is
    NumPy's x @ W (float32 sums: relative 1e-5)."""
    k, n = 640, 512  # (1.25 MiB of float32)
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("MatMul", ["h", "V"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["m", 8])],
                          [nh.from_array(rng.standard_normal((k, n)).astype(np.float32), "W"),
                           nh.from_array(rng.standard_normal((n, 8)).astype(np.float32), "V")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    x = rng.standard_normal((6, k)).astype(np.float32)
    stats = collect(model, [LayerInput("h", n)], [{"x": x}])
    h = x.astype(np.float64) @ nh.to_array(model.graph.initializer[0]).astype(np.float64)
    np.testing.assert_allclose(stats[LayerInput("h", n)].gram, h.T @ h, rtol=1e-5, atol=1e-5 * np.abs(h.T @ h).max())


# -- the rounding against the paper's equations ---------------------------------------------------

@pytest.mark.parametrize("bits,symmetric,group,act_order,scale_dtype", [
    (4, False, 16, False, "float32"), (4, True, 16, False, "float32"), (2, False, 32, False, "float32"),
    (8, True, -1, False, "float32"), (4, False, 16, True, "float32"), (4, True, 24, True, "float16"),
    (2, True, 20, True, "float32"), (8, False, 32, False, "bfloat16")])
@pytest.mark.parametrize("seed", [0, 1])
def test_codes_are_the_reference_implementations(bits, symmetric, group, act_order, scale_dtype, seed):
    """gptq_levels (the Cholesky factor, lazy blocks of 16) and the reference (the explicit inverse
    updated column by column) choose the same codes, scales and zero points on drawn layers (K = 72,
    so a group of 16, 20 or 24 ends within a block or crosses one; one dead channel).  The two sum in
    different orders (float64): a code may differ only where its value lies within 1e-9 of a
    rounding tie, which these draws never reach, so every code is equal."""
    import ml_dtypes  # noqa: F401  (bfloat16's NumPy dtype)

    k, n, m = 72, 24, 400
    rng = np.random.default_rng(seed)
    x = correlated(m, k, seed).astype(np.float64)
    x[:, 5] = 0  # (a dead channel)
    w = rng.standard_normal((n, k))
    g = k if group == -1 else group
    dtype = np.dtype(scale_dtype) if scale_dtype != "bfloat16" else np.dtype(ml_dtypes.bfloat16)
    got = gptq_levels(w, x.T @ x, group=g, bits=bits, symmetric=symmetric, scale_dtype=dtype,
                      settings=GptqSettings(block_size=16, act_order=act_order))
    levels, zeros, scales = reference_gptq(w, x, group=g, bits=bits, symmetric=symmetric, scale_dtype=dtype,
                                           act_order=act_order)
    np.testing.assert_array_equal(got.levels[:, :k], levels)
    np.testing.assert_array_equal(got.zeros, zeros)
    np.testing.assert_array_equal(got.scales.view(np.uint8), scales.view(np.uint8))


def test_the_block_size_changes_no_code():
    """The lazy batch only reorders sums: blocks of 1, 7 and 128 columns give the same codes."""
    k, n = 64, 16
    x = correlated(300, k, 3).astype(np.float64)
    w = np.random.default_rng(3).standard_normal((n, k))
    runs = [gptq_levels(w, x.T @ x, group=16, bits=4, symmetric=False, scale_dtype=np.float32,
                        settings=GptqSettings(block_size=b)) for b in (1, 7, 128)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.levels, runs[0].levels)
        np.testing.assert_array_equal(r.scales, runs[0].scales)


@pytest.mark.parametrize("act_order", [False, True])
def test_the_rounding_holds_at_most_two_and_a_half_k_by_k_arrays_beside_the_gram(act_order):
    """The Hessian is made once, as the factoriser's only reference, and let go of once factored; the
    triangular inverse is written into one array: NumPy's allocations (traced by tracemalloc) peak at
    2.5 K x K float64 beside the caller's X^T X (it was 5: the Hessian doubled, its copy, the factor,
    the inverse and the inverse's halves; on all-MiniLM-L6-v2's K = 1536, 18 MiB each)."""
    import tracemalloc

    k = 768
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2 * k, k))
    gram, w = x.T @ x, rng.standard_normal((k, 8))
    tracemalloc.start()
    try:
        gptq_weight(w, gram, axis=0, group_size=128, bits=4, symmetric=False, scale_dtype=np.float32,
                    settings=GptqSettings(act_order=act_order))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.6 * k * k * 8, f"{peak / (k * k * 8):.2f} K x K float64"


@pytest.mark.parametrize("act_order", [False, True])
def test_a_factor_given_is_the_one_computed_and_scale_estimation_factors_once(monkeypatch, act_order):
    """gptq_levels with `factor=factored(H)` gives its own codes bit for bit, and GPTQ with scale
    estimation (two runs of the loop on one Hessian: fitted and plain) factors the Hessian once."""
    from dyndq.quantization import gptq, scale_estimation

    k, n = 80, 12
    x = correlated(300, k, 4).astype(np.float64)
    w = np.random.default_rng(4).standard_normal((n, k))
    settings = GptqSettings(block_size=16, act_order=act_order)
    common = dict(group=16, bits=4, symmetric=False, scale_dtype=np.dtype(np.float32), settings=settings)
    own = gptq_levels(w, x.T @ x, **common)
    given = gptq_levels(w, x.T @ x, factor=gptq.factored(x.T @ x, settings), **common)
    for a, b in zip((own.levels, own.zeros, own.scales), (given.levels, given.zeros, given.scales)):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    calls = []
    real = gptq.upper_inverse_cholesky
    monkeypatch.setattr(gptq, "upper_inverse_cholesky", lambda h: calls.append(h.shape) or real(h))
    scale_estimation.gptq_weight_estimated(w.T.astype(np.float32), x.T @ x, axis=0, group_size=16, bits=4,
                                           symmetric=False, scale_dtype=np.float32, settings=settings,
                                           calibration_rows=300)
    assert calls == [(k, k)]


# -- GPTQ lowers the layer's output error ---------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_error_on_the_calibration_data_is_below_rtns(bits, symmetric, act_order, seed):
    """|X W - X W'|^2 on the calibration rows (correlated channels) is lower for GPTQ's W' than for
    rtn's, on every drawn layer (K = 96 along axis 0, groups of 32)."""
    k, n = 96, 40
    x = correlated(500, k, seed)
    w = np.random.default_rng(seed + 10).standard_normal((k, n)).astype(np.float32)
    fmt = formats.get("int")
    gptq = gptq_weight(w, x.astype(np.float64).T @ x.astype(np.float64), axis=0, group_size=32, bits=bits,
                       symmetric=symmetric, scale_dtype="float32", settings=GptqSettings(act_order=act_order))
    rtn = quantize_weight(w, axis=0, group_size=32, bits=bits, symmetric=symmetric)

    def error(q):
        return float(np.sum((x.astype(np.float64) @ (w - fmt.dequantize(q, np.float32)).astype(np.float64)) ** 2))

    assert error(gptq) < error(rtn)


# -- end to end -----------------------------------------------------------------------------------

@pytest.mark.parametrize("emit", ["dyndq", "onnx", "onnxruntime"])
def test_quantize_method_gptq_writes_what_it_chose_bit_for_bit_on_both_engines(tmp_path, capsys, emit):
    """`dyndq quantize --method gptq` on a model with its inputs (--inputs-dir): written, checked,
    and the weights the file gives back (x = I) are the dequantized codes gptq_weight chooses on
    the same calibration, bit for bit, on the reference engine and on ONNX Runtime (for --emit
    onnx and onnxruntime: the file as written on ONNX Runtime); the report says on what it was
    calibrated."""
    k, n = 64, 48
    model = two_layers(k, n)
    onnx.save(model, tmp_path / "float.onnx")
    dirs = []
    for i in range(3):
        folder = tmp_path / f"sample{i}"
        folder.mkdir()
        np.save(folder / "x.npy", correlated(20, k, 100 + i))
        dirs += ["--inputs-dir", str(folder)]
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(tmp_path / "float.onnx"), str(out), "--method", "gptq", "--group-size", "32",
                 "--emit", emit, *dirs]) == 0
    said = capsys.readouterr().out
    assert "gptq calibrated on 3 samples given" in said
    x = np.concatenate([correlated(20, k, 100 + i) for i in range(3)]).astype(np.float64)
    weights = {t.name: nh.to_array(t) for t in model.graph.initializer}
    fmt = formats.get("int")
    want = {name: fmt.dequantize(gptq_weight(weights[name], x.T @ x, axis=axis, group_size=32, bits=4, symmetric=False,
                                             scale_dtype="float32"), np.float32) for name, axis in (("W1", 0), ("W2", 1))}
    assert_two_layers_give_back(out, emit, want)
    # (and GPTQ's codes are not rtn's: the method did something)
    rtn = fmt.dequantize(quantize_weight(weights["W1"], axis=0, group_size=32, bits=4), np.float32)
    assert not np.array_equal(rtn, want["W1"])


def test_without_inputs_it_calibrates_on_seeded_samples_and_says_so():
    """No inputs: --samples seeded samples, named in the report's notes as made up."""
    _, report = dyndq.quantize(mlp(k=64, n=48, vocab=32), method="gptq", samples=2, evaluate=False)
    note = report.notes[0]
    assert note.startswith("gptq calibrated on 2 seeded samples (seed 0") and "made-up inputs" in note
    # (the Gather's table has no input to calibrate on: rtn's, and said)
    assert any("'E': read by Gather" in n and "rounded by rtn" in n for n in report.notes)
    assert report.options.settings()["damping"] == 0.01


def test_a_weight_read_twice_is_calibrated_on_both_inputs():
    """A weight shared by two MatMuls: its Hessian sums both inputs' X^T X (calibration.py)."""
    k = 16
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["a", "W"], ["y"]), helper.make_node("MatMul", ["b", "W"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(v, T.FLOAT, [10, k]) for v in "ab"],
                          [helper.make_tensor_value_info(v, T.FLOAT, [10, 8]) for v in "yz"],
                          [nh.from_array(rng.standard_normal((k, 8)).astype(np.float32), "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    feeds = {"a": correlated(10, k, 1), "b": correlated(10, k, 2)}
    out, _ = dyndq.quantize(model, method="gptq", group_size=16, inputs=feeds, evaluate=False)
    codes = nh.to_array(next(t for t in out.graph.initializer if t.name.startswith("W_quantized")))
    both = np.concatenate([feeds["a"], feeds["b"]]).astype(np.float64)
    want = gptq_weight(nh.to_array(model.graph.initializer[0]), both.T @ both, axis=0, group_size=16, bits=4,
                       symmetric=False, scale_dtype="float32")
    np.testing.assert_array_equal(codes.astype(np.uint8), want.codes.astype(np.uint8))


# -- bad options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,argument,found", [
    (dict(method="gptq", format="mxfp4"), "method", "'gptq' with format 'mxfp4'"),
    (dict(method="gptq", format="nvfp4"), "method", "'gptq' with format 'nvfp4'"),
    (dict(method="rtn", damping=0.1), "damping", "0.1 with method 'rtn'"),
    (dict(method="search", act_order=True), "act_order", "True with method 'search'"),
    (dict(method="gptq", damping=0), "damping", "0"),
    (dict(method="gptq", damping=float("nan")), "damping", "nan"),
    (dict(method="gptq", block_size=0), "block_size", "0"),
])
def test_bad_options_are_named(kwargs, argument, found):
    with pytest.raises(OptionError) as e:
        dyndq.quantize(mlp(k=64, n=48, vocab=32), evaluate=False, **kwargs)
    assert any(p.argument == argument and p.found == found for p in e.value.problems), e.value.problems


def test_the_cli_names_gptq_with_an_fp4_format(tmp_path, capsys):
    onnx.save(two_layers(), tmp_path / "f.onnx")
    assert main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--method", "gptq",
                 "--format", "mxfp4"]) == 2
    err = capsys.readouterr().err
    assert "method" in err and "'gptq' with format 'mxfp4'" in err and "Traceback" not in err
    assert not (tmp_path / "q.onnx").exists()


def test_a_model_with_external_data_is_calibrated_from_its_data_file(tmp_path):
    """quantize_file on a model whose weights are in an external data file (read one at a time,
    never the whole model loaded) writes the codes `dyndq.quantize` writes in memory."""
    from dyndq.quantization import quantize_file

    model = two_layers(64, 48)
    onnx.save(two_layers(64, 48), tmp_path / "float.onnx", save_as_external_data=True, location="float.data",
              size_threshold=0)  # (onnx.save moves the data of the model it is given: a copy of its own)
    feeds = [{"x": correlated(20, 64, i)} for i in range(2)]
    quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", method="gptq", inputs=feeds, group_size=32)
    in_memory, _ = dyndq.quantize(model, method="gptq", inputs=feeds, group_size=32, evaluate=False)
    written = dyndq.load_model(str(tmp_path / "q.onnx"))
    assert_same_initializers(written, in_memory)


def test_a_hessian_that_does_not_factor_leaves_the_weight_alone_naming_the_damping():
    """10 calibration rows for K = 64 (X^T X of rank 10) and a damping of 1e-20: H does not factor
    in float64; the weight is left alone and named, a larger damping asked for (the default
    factors it)."""
    model = two_layers(64, 48)
    feeds = {"x": correlated(10, 64, 0)}
    from dyndq.quantization import NothingToQuantize

    with pytest.raises(NothingToQuantize) as e:  # (its one weight left alone)
        dyndq.quantize(model, method="gptq", damping=1e-20, inputs=feeds, evaluate=False, ops=("MatMul",))
    assert [str(p) for p in e.value.problems] == [
        "graph 'main' node 0 'fc1' (MatMul): B ('W1'): found its inputs' X^T X plus damping 1e-20 not positive "
        "definite (it did not factor); allowed: a damping with which it factors: larger where X^T X is nearly "
        "singular (default 0.01)"]
    with pytest.raises(NothingToQuantize) as e:  # (one so large that H overflows)
        dyndq.quantize(model, method="gptq", damping=1e308, inputs=feeds, evaluate=False, ops=("MatMul",))
    assert "damping 1e+308 not positive definite" in str(e.value.problems[0])
    _, fine = dyndq.quantize(model, method="gptq", inputs=feeds, evaluate=False, ops=("MatMul",))
    assert not fine.left_alone and len(fine.layers) == 1


def test_a_model_onnx_runtime_cannot_run_is_said_not_a_traceback(tmp_path, capsys):
    """An index beyond the embedding's rows: ONNX Runtime refuses the sample; gptq names the model and
    the sample (exit 1), writing nothing."""
    onnx.save(mlp(k=64, n=48, vocab=32), tmp_path / "f.onnx")
    np.save(tmp_path / "ids.npy", np.array([1, 99], np.int64))
    code = main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--method", "gptq",
                 "--input", f"ids={tmp_path / 'ids.npy'}", "--no-evaluate"])
    err = capsys.readouterr().err
    assert code == 1 and "ONNX Runtime could not run it on sample 1 to collect the layers' inputs" in err, err
    assert "Traceback" not in err and not (tmp_path / "q.onnx").exists()


def test_ranking_leaves_gptq_out_unless_asked_and_gives_it_alone_its_options():
    """rank_methods ranks the data-free methods by default, gptq's damping given or not; asked for, gptq is
    ranked too, calibrated on the evaluation's seeded samples, and says so."""
    from dyndq.quantization import rank_methods

    model = mlp(k=64, n=48, vocab=32)
    assert sorted(m for m, _ in rank_methods(model, samples=2, damping=0.05)) == ["rtn", "search"]
    runs = dict(rank_methods(model, samples=2, methods=["rtn", "gptq"], damping=0.05))
    assert runs["gptq"].options.damping == 0.05 and runs["gptq"].notes[0].startswith("gptq calibrated on 2 seeded")
