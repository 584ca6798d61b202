"""opcheck: one row of the table through every layer, as torch.library.opcheck does for an op.
The one runner of the table's rows (tests/test_opcheck.py runs it on each)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

import dyndq
from dyndq.plumbing.types import elem_type

from .models import run_ort
from .oracles import oracle_3, same_bits
from .table import case_model

# ONNX Runtime's Python API takes no NumPy feeds of these: such arrays go in as initializers.
_NOT_FEEDABLE = ("int4", "uint4", "bfloat16", "int2", "uint2", "float8_e8m0fnu", *dyndq.opdefs.FLOAT_CODES_3)


def _onnxruntime_holds(case) -> bool:
    """Whether ONNX Runtime has tensors of the row's dtypes (else only constants of them run there)."""
    from dyndq.converters.engines import engine

    return all(engine("onnxruntime").holds(d) for d in (case.src[0], case.zps and case.zps[0]) if d)


def opcheck(case, *, seed: int = 0, onnxruntime: bool = True) -> None:
    """Check one valid row of the table with its own op version (case.op), for any version, in
    every layer (the one runner of the table's valid rows; invalid ones: `opcheck_invalid`):

    - the kernel: equal to the independent oracle (`oracle_2`) bit for bit;
    - the shape function: its spec is the kernel's output spec;
    - the model (`case_model`): onnx.checker's full check, ONNX's strict shape inference
      (dst's dtype and shape inferred, the declared ones cleared), and `dyndq.check` finding
      nothing, with scales/zps as graph inputs and as initializers;
    - `dyndq.run` on both engines (the reference evaluator through our kernel; ONNX Runtime after
      export, at its basic level, int4 and bfloat16 fed through the runner's exact boundary):
      one output "dst", the kernel's bits;
    - `dyndq.export` with scales/zps as graph inputs and as initializers (another seed): fully
      checked, no node of our domain left, and (initializers) ONNX Runtime at its default level
      gives the kernel's bits; a version-1 row lowers to one DequantizeLinear when its zero point
      is absent or of src's dtype, else to integer arithmetic (Cast, Sub, Mul).
    """
    from onnx.shape_inference import infer_shapes

    assert case.valid, f"{case.id} is an invalid row: opcheck_invalid judges it"
    op = case.op
    src, scales, zps = case.arrays(seed)
    got = _kernel_agrees(case, src, scales, zps)
    specs = [dyndq.TensorSpec.of(a) if a is not None else None for a in (src, scales, zps)]
    assert op.shape_inference(*specs, **case.attrs) == dyndq.TensorSpec.of(got)

    model = case_model(case)
    onnx.checker.check_model(model, full_check=True)
    loose = onnx.ModelProto()
    loose.CopyFrom(model)
    loose.graph.output[0].type.tensor_type.ClearField("shape")  # let inference fill it in
    loose.graph.output[0].type.tensor_type.elem_type = 0
    [inferred] = infer_shapes(loose, strict_mode=True).graph.output
    assert inferred.type.tensor_type.elem_type == elem_type(got.dtype.name), case.id
    assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == list(got.shape), case.id
    assert dyndq.check(model) == []
    assert dyndq.check(case_model(case, inputs_as="initializers", arrays=(src, scales, zps))) == []

    feeds = {"src": src, "scales": scales, **({} if zps is None else {"zps": zps})}
    engines = ("reference", "onnxruntime") if onnxruntime else ("reference",)
    for engine in engines:
        if engine == "onnxruntime" and not _onnxruntime_holds(case):
            continue  # it has no tensors of src's (or zps') dtype: constants only, below
        out = dyndq.run(model, feeds, engine=engine)
        assert list(out) == ["dst"] and same_bits(out["dst"], got), (case.id, engine)
    standard = dyndq.export(model)
    _exports_right(case, standard)
    if case.version >= 3:  # standard ONNX at the opset its types need: ONNX's own reference engine runs it
        out = dyndq.run(standard, feeds, engine="reference")
        assert same_bits(out["dst"], got), (case.id, "export onnx on onnx.reference")
    if not onnxruntime:
        return

    src, scales, zps = case.arrays(seed + 1)
    got = _kernel_agrees(case, src, scales, zps)
    feeds = {"src": src, "scales": scales, **({} if zps is None else {"zps": zps})}
    fixed = {"scales", "zps"} | ({"src"} if src.dtype.name in _NOT_FEEDABLE else set())
    exported = dyndq.export(case_model(case, initializers=fixed, arrays=(src, scales, zps)), target="onnxruntime")
    _exports_right(case, exported)
    if got.dtype.name == "bfloat16":  # ONNX Runtime returns no bfloat16: an exact Cast to float32 at the boundary
        exported = _bfloat16_output_as_float32(exported)
    [ort] = run_ort(exported, {k: v for k, v in feeds.items() if k not in fixed})
    if got.dtype.name == "bfloat16":
        ort = ort.astype(got.dtype)  # exact: every bfloat16 is a float32
    assert same_bits(ort, got), case.id


def _kernel_agrees(case, src, scales, zps) -> np.ndarray:
    got = case.op.kernel(src, scales, zps, **case.attrs)
    attrs = {"qtype": "per_tensor", "axis": 1, **case.attrs}
    axis = attrs["axis"] % max(1, src.ndim)
    want = oracle_3(src, scales, zps, attrs["qtype"], axis, attrs.get("group_shape"), attrs.get("output_dtype"))
    assert same_bits(got, want), case.id
    return got


def _exports_right(case, exported: onnx.ModelProto) -> None:
    """Standard ONNX that the checker fully checks; version 1's forms as its converter promises."""
    onnx.checker.check_model(exported, full_check=True)
    ops = [n.op_type for n in exported.graph.node]
    assert not any(n.domain == dyndq.DOMAIN for n in exported.graph.node), ops
    if case.version != 1:
        return
    same = case.zps is None or case.zps[0] == case.src[0]
    if same:
        assert ops.count("DequantizeLinear") == 1, (case.id, ops)
        assert set(ops) <= {"DequantizeLinear", "Reshape", "Constant", "Expand", "Shape"}, (case.id, ops)
    else:
        assert set(ops) <= {"Cast", "Sub", "Mul", "Reshape", "Constant"}, (case.id, ops)


def opcheck_invalid(case, *, seed: int = 0) -> None:
    """Check one invalid row: `dyndq.check` names exactly the row's bad arguments, each problem
    naming the node (its index, graph and op), what was found and what is allowed; the shape
    function and the kernel (with and without `out`) name the same (a declared dst is a graph's:
    neither has one); onnx.checker's full check refuses the model naming the node, and, where
    the refusal is our inference's, every bad argument."""
    import pytest

    from dyndq.schema import MARK

    assert not case.valid, f"{case.id} is a valid row: opcheck judges it"
    op = case.op
    src, scales, zps = case.arrays(seed)
    problems = dyndq.check(case_model(case, node_name="weights_dq"))
    assert {p.argument for p in problems} == set(case.bad), (case.id, problems)
    for p in problems:
        assert (p.node, p.node_index, p.graph) == ("weights_dq", 0, "main"), case.id
        assert p.op == f"{dyndq.DOMAIN}::DynamicDequantize" and p.found and p.allowed, case.id
        assert "weights_dq" in str(p) and p.argument in str(p) and p.allowed in str(p), case.id
    want = set(case.bad) - {"dst"}
    specs = [dyndq.TensorSpec(*a) if a is not None else None for a in (case.src, case.scales, case.zps)]
    try:
        op.shape_inference(*specs, **case.attrs)
        found = set()
    except dyndq.ValidationError as e:
        found = {p.argument for p in e.problems}
    assert found == want, case.id
    if want:
        with pytest.raises(dyndq.ValidationError) as e:
            op.kernel(src, scales, zps, **case.attrs)
        assert {p.argument for p in e.value.problems} == want, str(e.value)
        assert all(p.found and p.allowed for p in e.value.problems), case.id
        t2 = scales.dtype if scales.dtype.name in op.allowed_dtypes("dst") else np.dtype(np.float32)
        with pytest.raises(dyndq.ValidationError):
            op.kernel(src, scales, zps, out=np.empty(src.shape, t2), **case.attrs)
    with pytest.raises((onnx.shape_inference.InferenceError, onnx.checker.ValidationError)) as e:
        onnx.checker.check_model(case_model(case, node_name="bad_dq"), full_check=True)
    assert "bad_dq" in str(e.value), case.id
    if MARK in str(e.value):  # our own rules, not ONNX's type-constraint check
        assert all(arg in str(e.value) for arg in case.bad), (case.id, str(e.value))


def _bfloat16_output_as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The bfloat16 dst followed by an exact Cast to float32, as the graph's output."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    dst = g.output[0].name
    for n in g.node:
        for k, name in enumerate(n.output):
            if name == dst:
                n.output[k] = dst + "_bf16"
    g.node.append(helper.make_node("Cast", [dst + "_bf16"], [dst], to=onnx.TensorProto.FLOAT))
    g.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return out
