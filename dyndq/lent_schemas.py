"""ONNX Runtime's own schemas of the ops a model holds that ONNX has none of (com.microsoft's
MatMulNBits, GatherBlockQuantized, ...), lent to ONNX while `dyndq.check` runs its checker.

Why: ONNX's full check infers types through model-local functions strictly.  A node of a
function that another function calls, reading a value made by an op ONNX has no schema for (a
MatMulNBits that `export --target onnxruntime` wrote inside the function), finds no type, and the
checker refuses the model ("Input 0 expected to have type but instead is null"), though the same
value in the main graph goes unjudged and ONNX Runtime loads the file.  ONNX Runtime knows its
ops (`get_all_operator_schema`: inputs, outputs, attributes, type constraints); lent to ONNX,
with a type inference that gives each output the type of the first input of its type parameter,
they let the checker type those values, and judge those nodes against ONNX Runtime's own
definition.  Lent for the check only: a user's onnx is never left with schemas it did not have.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import onnx
import onnx.defs
from onnx.defs import OpSchema

from dyndq.plumbing.walk import walk

_lock = threading.RLock()  # (ONNX's registry is one for the process)


@contextlib.contextmanager
def lent(model: onnx.ModelProto):
    """Within this block, ONNX knows ONNX Runtime's schema of each op the model holds that ONNX
    has none of and ONNX Runtime has, at the version the model imports its domain."""
    # (the version each scope imports the node's domain at: a function's own imports for its nodes)
    wanted = {(site.node.domain, site.node.op_type, site.opsets.get(site.node.domain)) for site in walk(model)}
    found = {s for s in (_schema(domain, op_type, version) for domain, op_type, version in wanted) if s is not None}
    schemas = sorted(found, key=lambda s: (s.domain, s.name, s.since_version))
    with _lock:
        registered = []
        try:
            for schema in schemas:
                if onnx.defs.has(schema.name, schema.since_version, schema.domain):
                    continue  # (lent already, by a check this one runs inside)
                onnx.defs.register_schema(schema)
                registered.append(schema)
            yield
        finally:
            for schema in registered:
                onnx.defs.deregister_schema(schema.name, schema.since_version, schema.domain)


@functools.lru_cache(maxsize=None)
def _schema(domain: str, op_type: str, version: int | None) -> OpSchema | None:
    """ONNX Runtime's schema of the op, as an ONNX OpSchema; None where ONNX has one, or ONNX
    Runtime has none, or the scope does not import the domain."""
    if domain in ("", "ai.onnx") or version is None or onnx.defs.has(op_type, version, domain):
        return None
    found = [s for s in _ort_schemas().get((domain, op_type), ()) if s.since_version <= version]
    return _as_onnx(max(found, key=lambda s: s.since_version)) if found else None


@functools.lru_cache(maxsize=1)
def _ort_schemas() -> dict:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    out: dict = {}
    for s in ort_c.get_all_operator_schema():
        if s.domain not in ("", "ai.onnx"):
            out.setdefault((s.domain, s.name), []).append(s)
    return out


def _as_onnx(s) -> OpSchema:
    def param(p):
        return OpSchema.FormalParameter(p.name, p.typeStr, p.description or "",
                                        param_option=OpSchema.FormalParameterOption[p.option.name],
                                        is_homogeneous=p.isHomogeneous)

    schema = OpSchema(
        s.name, s.domain, s.since_version, s.doc or "",
        inputs=[param(p) for p in s.inputs], outputs=[param(p) for p in s.outputs],
        type_constraints=[(c.type_param_str, list(c.allowed_type_strs), c.description or "")
                          for c in s.type_constraints],
        attributes=[OpSchema.Attribute(a.name, OpSchema.AttrType[a.type.name], a.description or "",
                                       required=a.required) for a in s.attributes.values()])
    schema.set_type_and_shape_inference_function(_types_from_inputs([p.typeStr for p in s.inputs],
                                                                    [p.typeStr for p in s.outputs]))
    return schema


def _types_from_inputs(inputs: list[str], outputs: list[str]):
    """Each output gets the type of the first input given of its type parameter (MatMulNBits' Y
    that of A; GatherBlockQuantized's output that of its scales); its shape is left unknown."""

    def infer(ctx) -> None:
        for k, param in enumerate(outputs):
            for i, p in enumerate(inputs):
                if p == param and i < ctx.get_num_inputs() and ctx.has_input(i):
                    tp = ctx.get_input_type(i)
                    if tp is not None and tp.tensor_type.elem_type:
                        out = onnx.TypeProto()
                        out.tensor_type.elem_type = tp.tensor_type.elem_type
                        ctx.set_output_type(k, out)
                        break

    return infer
