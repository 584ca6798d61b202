"""dyndq.run(engine="onnxruntime") and `dyndq run --engine onnxruntime` on version-2 graphs:
the same arrays as the reference engine, dtypes included, int4 and bfloat16 inputs and
outputs too (ONNX Runtime's Python API takes and gives neither)."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from cases import oracle_2, same_bits, vi

import dyndq
from dyndq.cli import main

NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4,
      "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15)}


def ints(rng, dtype, shape):
    lo, hi = RANGE[dtype]
    return np.asarray(rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64)).astype(NP[dtype])


def floats(rng, dtype, shape):
    a = rng.standard_normal(shape) * 0.05
    if a.size:  # and a NaN with a payload, an infinity and a subnormal: their bits must come through
        a.flat[rng.integers(0, a.size)] = rng.choice([np.inf, -1e-40, 3e-8])
    out = np.asarray(np.asarray(a, np.float32).astype(NP[dtype]))
    if out.size > 1:  # a NaN with a payload
        bits = {"float32": 0x7FC00123, "bfloat16": 0x7FC5, "float16": 0x7E05}[dtype]
        out.view(np.uint32 if dtype == "float32" else np.uint16).flat[0] = bits
    return out


def equal(a, b) -> bool:
    """Same dtype, shape and bits (integers by value)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.name in ("float32", "float16", "bfloat16"):
        return same_bits(a, b)
    return np.array_equal(a.astype(np.int64), b.astype(np.int64))


@st.composite
def graphs(draw):
    src = draw(st.sampled_from(["int8", "uint8", "int4", "uint4"]))
    t2 = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    zp = draw(st.sampled_from([None, src, src, "int8", "uint8", "int32", "int4", "uint4"]))
    qtype = draw(st.sampled_from(["per_tensor", "per_channel", "per_group"]))
    rows, cols = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    attrs = {"qtype": qtype}
    if qtype == "per_group":
        g = draw(st.sampled_from([[1, 4], [2, 1], [1, 1], [2, 4]]))
        shape, sshape = (rows * g[0], cols * g[1]), (rows, cols)
        attrs["group_shape"] = g
    elif qtype == "per_channel":
        shape, attrs["axis"] = (rows, cols), draw(st.sampled_from([0, 1, -1]))
        sshape = (shape[attrs["axis"]],)
    else:
        shape, sshape = (rows, cols), (1,)
    return src, t2, zp, attrs, shape, sshape, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


def build(src, t2, zp, attrs, shape, sshape, as_init, seed):
    rng = np.random.default_rng(seed)
    arrays = {"src": ints(rng, src, shape), "scales": floats(rng, t2, sshape)}
    if zp is not None:
        arrays["zps"] = ints(rng, zp, sshape)
    names = list(arrays)
    inits = [numpy_helper.from_array(arrays[n], n) for n in names[1:]] if as_init else []
    inputs = [vi(n, str(arrays[n].dtype), list(arrays[n].shape)) for n in (names[:1] if as_init else names)]
    nodes = [dyndq.make_node(names, ["dst"], name="dq", version=2, **attrs),
             # the src itself as an output too: an int4 output must come back as int4
             helper.make_node("Identity", ["dst"], ["copy"], name="copy")]
    graph = helper.make_graph(nodes, "g", inputs, [vi("dst", t2, list(shape)), vi("copy", t2, list(shape))],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import(2)],
                              ir_version=10)
    feeds = {n: arrays[n] for n in (names[:1] if as_init else names)}
    return model, feeds, arrays


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_both_engines_return_the_same_arrays(p):
    model, feeds, arrays = build(*p)
    ref = dyndq.run(model, feeds, engine="reference")
    got = dyndq.run(model, feeds, engine="onnxruntime")
    assert list(got) == list(ref) == ["dst", "copy"]
    want = oracle_2(arrays["src"], arrays["scales"], arrays.get("zps"), p[3]["qtype"], p[3].get("axis", 1),
                    p[3].get("group_shape"))
    for name in ref:
        assert equal(ref[name], want), name
        assert equal(got[name], want), name


def _passthrough_model():
    """int4, uint4 and bfloat16 graph inputs that are also graph outputs, beside a node of ours."""
    nodes = [dyndq.make_node(["w", "s"], ["d"], name="dq", version=2, qtype="per_group", group_shape=[1, 2]),
             helper.make_node("Cast", ["w"], ["w_again"], to=TensorProto.INT4, name="w_again")]
    graph = helper.make_graph(nodes, "g", [vi("w", "int4", [2, 4]), vi("s", "bfloat16", [2, 2]), vi("u", "uint4", [3])],
                              [vi("d", "bfloat16", [2, 4]), vi("w_again", "int4", [2, 4]), vi("u", "uint4", [3]),
                               vi("s", "bfloat16", [2, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import(2)], ir_version=10)


def test_int4_and_bfloat16_inputs_and_outputs_come_back_with_their_dtypes_and_bits():
    model = _passthrough_model()
    w = np.array([[-8, -1, 0, 7], [1, 2, 3, 4]], ml_dtypes.int4)
    s = np.array([[0.5, np.inf], [-0.0, 3e-39]], np.float32).astype(ml_dtypes.bfloat16)
    s.view(np.uint16)[0, 1] = 0x7F81  # a signaling NaN: ORT must not quiet it on the way in or out
    u = np.array([0, 9, 15], ml_dtypes.uint4)
    feeds = {"w": w, "s": s, "u": u}
    before = model.SerializeToString()
    ref = dyndq.run(model, feeds)
    got = dyndq.run(model, feeds, engine="onnxruntime")
    assert model.SerializeToString() == before
    for name in ("d", "w_again", "u", "s"):
        assert got[name].dtype == ref[name].dtype, name
        assert equal(got[name], ref[name]), name
    assert got["s"].view(np.uint16)[0, 1] == 0x7F81
    assert equal(got["d"], dyndq.dynamic_dequantize(w, s, qtype="per_group", group_shape=[1, 2]))


def test_the_exported_model_is_left_as_export_wrote_it():
    """The boundary conversions go into the runner's own copy, not into the export."""
    from dyndq.runner import runner

    r = runner(_passthrough_model(), "onnxruntime")
    assert [(i.name, i.type.tensor_type.elem_type) for i in r.exported.graph.input] == [
        ("w", TensorProto.INT4), ("s", TensorProto.BFLOAT16), ("u", TensorProto.UINT4)]
    assert r.exported == dyndq.export(_passthrough_model())


def test_a_feed_of_the_wrong_dtype_is_still_named():
    model = _passthrough_model()
    feeds = {"w": np.zeros((2, 4), np.int8), "s": np.zeros((2, 2), ml_dtypes.bfloat16), "u": np.zeros(3, ml_dtypes.uint4)}
    with pytest.raises(dyndq.ValidationError, match=r"w.*int8.*int4"):
        dyndq.run(model, feeds, engine="onnxruntime")


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_cli_runs_int4_and_bfloat16_inputs_on_both_engines(tmp_path):
    """np.save writes ml_dtypes arrays as raw bytes ('|V1', '|V2'); run takes them as the input's dtype."""
    model = _passthrough_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    w = np.array([[-8, -1, 0, 7], [1, 2, 3, 4]], ml_dtypes.int4)
    s = np.array([[0.5, 2], [-0.25, 3e-3]], np.float32).astype(ml_dtypes.bfloat16)
    u = np.array([0, 9, 15], ml_dtypes.uint4)
    argv = ["run", str(path)]
    for name, a in (("w", w), ("s", s), ("u", u)):
        np.save(tmp_path / f"{name}.npy", a)
        argv += ["--input", f"{name}={tmp_path / name}.npy"]
    texts = {}
    for engine in ("reference", "onnxruntime"):
        code, text, err = _cli(argv + ["--engine", engine])
        assert (code, err) == (0, ""), err
        texts[engine] = text
        code, _, err = _cli(argv + ["--engine", engine, "--output-dir", str(tmp_path / engine)])
        assert (code, err) == (0, "")
    assert texts["reference"] == texts["onnxruntime"]
    assert texts["reference"].splitlines()[0].startswith("d: bfloat16[2, 4]  min -4  max 14  mean 1.09638  first [-4, -0.5, 0, 14, -0.25, -0.5, ...]")
    want = dyndq.dynamic_dequantize(w, s, qtype="per_group", group_shape=[1, 2])
    for engine in ("reference", "onnxruntime"):
        d = np.load(tmp_path / engine / "d.npy")
        assert d.tobytes() == want.tobytes() and d.shape == want.shape


def test_float16_nan_payloads_agree():
    """float16 NaN scales with payloads: ORT's float16 conversions keep payloads in some paths
    and not in others; every engine gives the one quiet NaN 0x7E00, at every position."""
    x = np.array([3, -2] * 9, np.int8)  # 18 elements: ORT's vector loop (8 at a time) and its scalar tail
    s = np.array([0x7E05, 0xFE05] * 9, np.uint16).view(np.float16)
    graph = helper.make_graph([dyndq.make_node(["x", "s"], ["y"], name="dq", version=2, qtype="per_channel", axis=0)],
                              "g", [vi("x", "int8", [18]), vi("s", "float16", [18])], [vi("y", "float16", [18])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import(2)], ir_version=10)
    feeds = {"x": x, "s": s}
    ref = dyndq.run(model, feeds)["y"]
    assert equal(dyndq.run(model, feeds, engine="onnxruntime")["y"], ref)
    assert ref.view(np.uint16).tolist() == [0x7E00] * 18
