"""Scale estimation (dyndq/quantization/scale_estimation.py): the refit against a reference written from
its equations (tests/scale_estimation_reference.py), the layer's output error never above the method's
without it and below it on correlated inputs, `dyndq quantize --scale-estimation` end to end bit for bit,
the triangular inverse GPTQ now takes, and the refusals."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import dyndq
from dyndq.cli import main
from dyndq.quantization import formats
from dyndq.quantization.activations import ActivationStats
from dyndq.quantization.gptq import GptqSettings, gptq_weight, lower_inverse, upper_inverse_cholesky
from dyndq.quantization.numerics import quantize_weight
from dyndq.quantization.options import OptionError
from dyndq.quantization.scale_estimation import (damped, gptq_weight_estimated, levels_of, output_error,
                                                 refine_levels, refine_weight)

from scale_estimation_reference import reference_damped, reference_scale_estimation
from quantize_models import assert_two_layers_give_back, correlated, mlp, two_layers


SCALE_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
                "bfloat16": np.dtype(ml_dtypes.bfloat16)}


# -- the refit against the equations --------------------------------------------------------------

@pytest.mark.parametrize("bits,symmetric,group,scale_dtype,method", [
    (4, False, 16, "float32", "rtn"), (4, True, 16, "float32", "rtn"), (2, False, 16, "float16", "rtn"),
    (8, False, 24, "bfloat16", "rtn"), (4, False, 12, "float16", "search"), (2, True, 16, "float32", "search"),
    (4, False, -1, "float32", "search")])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_refit_is_the_reference_implementations(bits, symmetric, group, scale_dtype, method, seed):
    """refine_levels (every row at once, each group's pull of the others through X^T X) and the
    reference (one row and one group at a time, from the equations) choose the same codes, zero
    points and scales, bit for bit, from the method's, on drawn layers (K = 40: a group of 16 or 12
    ends short; a group of 24 is one and a short one; one dead channel)."""
    k, n = 40, 12
    x = correlated(300, k, seed).astype(np.float64)
    x[:, 3] = 0
    gram = x.T @ x
    w = np.random.default_rng(seed + 5).standard_normal((n, k)).astype(np.float32)
    dtype = SCALE_DTYPES[scale_dtype]
    q = quantize_weight(w, axis=1, group_size=group, bits=bits, symmetric=symmetric, scale_dtype=dtype, method=method)
    start = levels_of(q, bits, symmetric)
    g = k if group == -1 else group
    got = refine_levels(w.astype(np.float64), gram, start, group=g, bits=bits, symmetric=symmetric, scale_dtype=dtype)
    levels, zeros, scales = reference_scale_estimation(w, gram, start.levels, start.zeros.astype(np.float64),
                                                       start.scales, group=g, bits=bits, symmetric=symmetric)
    np.testing.assert_array_equal(got.levels, levels)
    np.testing.assert_array_equal(got.zeros, zeros.astype(np.uint8))
    np.testing.assert_array_equal(got.scales.view(np.uint8), scales.view(np.uint8))
    assert not np.array_equal(got.scales.view(np.uint8), start.scales.view(np.uint8))  # (it refitted some)


def test_a_weight_along_either_axis_is_written_as_refitted():
    """refine_weight on [K, N] (axis 0) and on its transpose (axis 1) writes the same codes, scales and
    zero points, transposed, and the codes are the scales' own rounding of the weight."""
    k, n = 48, 20
    x = correlated(200, k, 4).astype(np.float64)
    w = np.random.default_rng(4).standard_normal((k, n)).astype(np.float32)
    q0 = refine_weight(w, quantize_weight(w, axis=0, group_size=16), x.T @ x, bits=4, symmetric=False)
    q1 = refine_weight(w.T.copy(), quantize_weight(w.T.copy(), axis=1, group_size=16), x.T @ x, bits=4,
                       symmetric=False)
    np.testing.assert_array_equal(q0.codes.astype(np.uint8), q1.codes.astype(np.uint8).T)
    np.testing.assert_array_equal(q0.scales, q1.scales.T)
    np.testing.assert_array_equal(q0.zero_points.astype(np.uint8), q1.zero_points.astype(np.uint8).T)
    # (each code: rtn's rounding against the scale as written)
    s = np.repeat(q0.scales, 16, axis=0)
    z = np.repeat(q0.zero_points.astype(np.float32), 16, axis=0)
    levels = np.clip(np.floor(w * (np.float32(1) / s) + z + np.float32(0.5)), 0, 15)
    np.testing.assert_array_equal(q0.codes.astype(np.uint8), levels.astype(np.uint8))


# -- the output error -----------------------------------------------------------------------------

def _with_and_without(method, w, gram, *, bits, symmetric, scale_dtype="float32"):
    if method == "gptq":
        plain = gptq_weight(w, gram, axis=0, group_size=32, bits=bits, symmetric=symmetric, scale_dtype=scale_dtype)
        fitted = gptq_weight_estimated(w, gram, axis=0, group_size=32, bits=bits, symmetric=symmetric,
                                       scale_dtype=scale_dtype, settings=GptqSettings())
        return plain, fitted
    plain = quantize_weight(w, axis=0, group_size=32, bits=bits, symmetric=symmetric, scale_dtype=scale_dtype,
                            method=method)
    return plain, refine_weight(w, plain, gram, bits=bits, symmetric=symmetric)


@pytest.mark.parametrize("method", ["rtn", "search", "gptq"])
@pytest.mark.parametrize("bits,symmetric", [(2, False), (4, False), (4, True), (8, False)])
@pytest.mark.parametrize("seed", [0, 1])
def test_output_error_is_below_the_methods_own_on_correlated_inputs(method, bits, symmetric, seed):
    """|X W - X W'|^2 on the calibration rows (correlated channels of unequal scales) is below the
    method's own without scale estimation, on every drawn layer (K = 96 along axis 0, groups of 32)."""
    k, n = 96, 40
    x = correlated(500, k, seed).astype(np.float64)
    w = np.random.default_rng(seed + 10).standard_normal((k, n)).astype(np.float32)
    fmt = formats.get("int")
    plain, fitted = _with_and_without(method, w, x.T @ x, bits=bits, symmetric=symmetric)

    def error(q):
        return float(np.sum((x @ (w - fmt.dequantize(q, np.float32)).astype(np.float64)) ** 2))

    assert error(fitted) < error(plain)


@pytest.mark.parametrize("method", ["rtn", "search", "gptq"])
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
def test_never_above_without_it_on_white_inputs_and_rounded_scales(method, scale_dtype):
    """On uncorrelated inputs of equal scale (where the weight error is the output error) and with
    scales rounded to float16 or bfloat16, the output error is still at most the method's own."""
    k, n = 64, 24
    x = np.random.default_rng(7).standard_normal((400, k))
    w = np.random.default_rng(8).standard_normal((k, n)).astype(np.float32)
    plain, fitted = _with_and_without(method, w, x.T @ x, bits=4, symmetric=False, scale_dtype=scale_dtype)
    rows = w.T.astype(np.float64)
    gram = x.T @ x
    assert output_error(rows, gram, levels_of(fitted, 4, False), 32) <= output_error(rows, gram,
                                                                                     levels_of(plain, 4, False), 32)
    assert fitted.scales.dtype == SCALE_DTYPES[scale_dtype]


# -- end to end -----------------------------------------------------------------------------------

def _samples(tmp_path, k):
    dirs, rows = [], []
    for i in range(3):
        folder = tmp_path / f"sample{i}"
        folder.mkdir()
        x = correlated(20, k, 100 + i)
        np.save(folder / "x.npy", x)
        dirs += ["--inputs-dir", str(folder)]
        rows.append(x)
    return dirs, rows


# -- few calibration rows: X^T X damped -------------------------------------------------------------

def test_the_damped_gram_is_the_references():
    """damped(G, R) is G + 0.25 (K / R - 1) * mean(diag G) * I bit for bit (the reference's
    equation) for R < K; G itself without a row count, with R >= K rows, and where G's diagonal is
    all 0 (no activation)."""
    x = correlated(6, 40, 0).astype(np.float64)
    gram = x.T @ x
    for rows in (1, 6, 39):
        np.testing.assert_array_equal(damped(gram, rows).view(np.uint64), reference_damped(gram, rows).view(np.uint64))
        assert not np.array_equal(damped(gram, rows), gram)
    for rows in (None, 40, 1000):
        assert damped(gram, rows) is gram
    np.testing.assert_array_equal(damped(np.zeros((8, 8)), 3), np.zeros((8, 8)))


@pytest.mark.parametrize("symmetric,method", [(False, "rtn"), (True, "search"), (False, "search")])
def test_the_damped_refit_is_the_reference_implementations(symmetric, method):
    """refine_weight with 6 calibration rows for K = 40 (X^T X of rank 6) is the reference's refit on
    the reference's damped X^T X, bit for bit, and not the undamped fit's choice."""
    k, n, rows = 40, 12, 6
    x = correlated(rows, k, 2).astype(np.float64)
    gram = x.T @ x
    w = np.random.default_rng(7).standard_normal((k, n)).astype(np.float32)
    q = quantize_weight(w, axis=0, group_size=16, bits=4, symmetric=symmetric, method=method)
    got = levels_of(refine_weight(w, q, gram, bits=4, symmetric=symmetric, calibration_rows=rows), 4, symmetric)
    start = levels_of(q, 4, symmetric)
    levels, zeros, scales = reference_scale_estimation(w.T, reference_damped(gram, rows), start.levels,
                                                       start.zeros.astype(np.float64), start.scales, group=16,
                                                       bits=4, symmetric=symmetric)
    np.testing.assert_array_equal(got.levels, levels)
    np.testing.assert_array_equal(got.zeros, zeros.astype(np.uint8))
    np.testing.assert_array_equal(got.scales.view(np.uint8), scales.view(np.uint8))
    undamped = levels_of(refine_weight(w, q, gram, bits=4, symmetric=symmetric), 4, symmetric)
    assert not np.array_equal(got.scales.view(np.uint8), undamped.scales.view(np.uint8))


@pytest.mark.parametrize("seed", range(4))
def test_with_fewer_rows_than_k_the_damped_fit_does_not_overfit(seed):
    """4 calibration rows for K = 128 (X^T X of rank 4): the undamped fit's output error on 1024
    held-out rows of the same distribution is above rtn's (it overfits: x1.12 to x1.7 on these
    seeds), the damped fit's (calibration_rows=4) below it."""
    from dyndq.quantization import formats

    k, n, rows = 128, 32, 4
    x = correlated(rows + 1024, k, seed).astype(np.float64)
    calibration, held = x[:rows], x[rows:]
    w = np.random.default_rng(seed + 9).standard_normal((k, n)).astype(np.float32)
    rtn = quantize_weight(w, axis=0, group_size=32, method="rtn")

    def held_out(q):
        wq = formats.get("int").dequantize(q, np.float32).astype(np.float64)
        return float(np.linalg.norm(held @ (w.astype(np.float64) - wq)))

    gram = calibration.T @ calibration
    undamped = refine_weight(w, rtn, gram, bits=4, symmetric=False)
    dampened = refine_weight(w, rtn, gram, bits=4, symmetric=False, calibration_rows=rows)
    assert held_out(undamped) > 1.1 * held_out(rtn)
    assert held_out(dampened) < held_out(rtn)


@pytest.mark.parametrize("method", ["rtn", "search", "gptq"])
@pytest.mark.parametrize("emit", ["dyndq", "onnx", "onnxruntime"])
def test_quantize_scale_estimation_writes_what_it_chose_bit_for_bit(tmp_path, capsys, method, emit):
    """`dyndq quantize --method M --scale-estimation --inputs-dir ...`: written, checked, and the
    weights the file gives back (x = I) are the dequantized weights scale estimation chooses on the
    same calibration (X^T X summed per sample, as activations.py sums it), bit for bit, on the
    reference engine and ONNX Runtime (--emit onnx/onnxruntime: the file as written, on ONNX
    Runtime); not the method's own weights; the report says what was calibrated on what."""
    from dyndq.quantization import scale_estimation

    k, n = 64, 48
    model = two_layers(k, n)
    onnx.save(model, tmp_path / "float.onnx")
    dirs, rows = _samples(tmp_path, k)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(tmp_path / "float.onnx"), str(out), "--method", method, "--scale-estimation",
                 "--group-size", "32", "--emit", emit, *dirs]) == 0
    said = capsys.readouterr().out
    assert f"{method} with scale estimation calibrated on 3 samples given" in said
    stats = ActivationStats.empty(k)
    for x in rows:
        stats.add(x)
    weights = {t.name: nh.to_array(t) for t in model.graph.initializer}
    fmt = formats.get("int")
    options = dyndq.quantization.options.QuantizeOptions.checked(model, method=method, group_size=32,
                                                                  scale_estimation=True)

    class Target:
        def __init__(self, axis):
            self.axis, self.dtype, self.rule = axis, "float32", "matmul"

    want = {name: fmt.dequantize(scale_estimation.quantize(weights[name], Target(axis), options, stats.gram,
                                                          stats.rows),
                                 np.float32) for name, axis in (("W1", 0), ("W2", 1))}
    assert_two_layers_give_back(out, emit, want)
    without = gptq_weight(weights["W1"], stats.gram, axis=0, group_size=32, bits=4, symmetric=False,
                          scale_dtype="float32") if method == "gptq" else quantize_weight(
        weights["W1"], axis=0, group_size=32, method=method)
    assert not np.array_equal(fmt.dequantize(without, np.float32), want["W1"])


@pytest.mark.openvino
def test_emit_openvino_gives_the_refitted_weights_on_openvino(tmp_path):
    """--emit openvino with --scale-estimation loads on OpenVINO and gives the weights the reference
    engine gives for `dyndq.quantize(..., scale_estimation=True)` on the same inputs, bit for bit."""
    from engines import needs_openvino, run_openvino

    needs_openvino()
    k, n = 64, 48
    model = two_layers(k, n)
    onnx.save(model, tmp_path / "float.onnx")
    dirs, rows = _samples(tmp_path, k)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(tmp_path / "float.onnx"), str(out), "--scale-estimation", "--group-size", "32",
                 "--emit", "openvino", *dirs]) == 0
    quantized, _ = dyndq.quantize(model, group_size=32, scale_estimation=True, inputs=[{"x": x} for x in rows],
                                  evaluate=False)
    eye = {"x": np.eye(k, dtype=np.float32)}
    want = dyndq.run(quantized, eye)
    got = run_openvino(dyndq.load_model(str(out)), eye)
    assert got[0].tobytes() == want["y1"].tobytes() and got[1].tobytes() == want["y2"].tobytes()


def test_without_inputs_it_calibrates_on_seeded_samples_and_says_so():
    _, report = dyndq.quantize(mlp(k=64, n=48, vocab=32), scale_estimation=True, samples=2, evaluate=False)
    assert report.notes[0].startswith("rtn with scale estimation calibrated on 2 seeded samples (seed 0")
    assert "made-up inputs" in report.notes[0]
    assert any("'E': read by Gather" in n and "rounded by rtn" in n for n in report.notes)
    assert report.options.settings()["scale_estimation"] is True
    assert "(groups of 128, asymmetric, rtn with scale estimation)" in report.summary()


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,found", [
    (dict(format="mxfp4"), "True with format 'mxfp4'"),
    (dict(format="nvfp4"), "True with format 'nvfp4'"),
])
def test_refusals_are_named(kwargs, found):
    with pytest.raises(OptionError) as e:
        dyndq.quantize(mlp(k=64, n=48, vocab=32), evaluate=False, scale_estimation=True, **kwargs)
    assert any(p.argument == "scale_estimation" and p.found == found for p in e.value.problems), e.value.problems


def test_a_non_boolean_is_named():
    with pytest.raises(OptionError) as e:
        dyndq.quantize(mlp(k=64, n=48, vocab=32), evaluate=False, scale_estimation="yes")
    assert [p.argument for p in e.value.problems] == ["scale_estimation"]


def test_the_cli_names_scale_estimation_with_an_fp4_format(tmp_path, capsys):
    onnx.save(two_layers(), tmp_path / "f.onnx")
    for argv in (["--format", "nvfp4"],):
        assert main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--scale-estimation",
                     *argv]) == 2, argv
        err = capsys.readouterr().err
        assert "--scale-estimation: found True with" in err and "Traceback" not in err, err
        assert not (tmp_path / "q.onnx").exists()


# -- GPTQ's triangular inverse --------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 7, 64, 65, 200])
def test_the_triangular_inverse_is_lower_and_inverts(k):
    """lower_inverse of a Cholesky factor is exactly lower triangular and its inverse (to 1e-10 of
    the identity); upper_inverse_cholesky's U is exactly upper with U^T U = H^-1."""
    x = correlated(3 * k + 5, k, k).astype(np.float64)
    h = x.T @ x + 0.01 * np.eye(k)
    m = np.linalg.cholesky(h)
    inv = lower_inverse(m)
    assert not np.triu(inv, 1).any()
    np.testing.assert_allclose(inv @ m, np.eye(k), atol=1e-10)
    u = upper_inverse_cholesky(h)
    assert not np.tril(u, -1).any()
    np.testing.assert_allclose(u.T @ u @ h, np.eye(k), atol=1e-8)
