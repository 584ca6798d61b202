"""Each registered op version, as an `onnx.defs.OpSchema` registered with ONNX.

Registration is what makes `onnx.checker.check_model(full_check=True)` and
`onnx.shape_inference.infer_shapes(strict_mode=True)` understand our ops: ONNX
checks the type constraints itself and calls our Python shape function.
"""
from __future__ import annotations

import atexit
import contextlib
import threading

import onnx
import onnx.defs
from onnx.defs import OpSchema
from onnx.shape_inference import InferenceError

from dyndq.opdefs import OpVersion, ValidationError, all_versions
from dyndq.onnx_types import attribute_values, onnx_type_string, spec_of_type, type_of_spec

MARK = "[dyndq]"  # starts every message our inference raises inside ONNX

_state = threading.local()


@contextlib.contextmanager
def lenient_inference():
    """Within this block our inference never raises.

    ONNX's non-strict shape inference still propagates errors raised by a Python
    inference function, so `dyndq.check`, which wants the types of every value
    even in a graph with mistakes (to report them all), switches ours off here.
    """
    previous = getattr(_state, "lenient", False)
    _state.lenient = True
    try:
        yield
    finally:
        _state.lenient = previous


def _inference_for(op: OpVersion):
    n_inputs = len(op.inputs)

    def infer(ctx) -> None:
        specs = [
            spec_of_type(ctx.get_input_type(i)) if i < ctx.get_num_inputs() and ctx.has_input(i) else None
            for i in range(n_inputs)
        ]
        if specs[0] is None:
            return  # nothing known of src: nothing to infer
        attrs = op.defaults()
        for name in attrs:
            a = ctx.get_attribute(name)
            if a is not None:
                attrs[name] = attribute_values_of(a)
        try:
            out = op.shape_inference(*specs, **attrs)
        except ValidationError as e:
            if getattr(_state, "lenient", False):
                return
            raise InferenceError(f"{MARK} {ctx.get_display_name()}: {e}") from None
        ctx.set_output_type(0, type_of_spec(out, like=ctx.get_input_type(0)))

    return infer


def attribute_values_of(attr: onnx.AttributeProto):
    node = onnx.NodeProto()
    node.attribute.append(attr)
    return attribute_values(node)[attr.name]


_ATTR_TYPES = {str: OpSchema.AttrType.STRING, int: OpSchema.AttrType.INT}
_PARAM = OpSchema.FormalParameter
_OPTION = OpSchema.FormalParameterOption


def to_onnx_schema(op: OpVersion) -> OpSchema:
    def param(p):
        option = _OPTION.Optional if p.optional else _OPTION.Single
        return _PARAM(p.name, p.type_var, p.doc, param_option=option)

    schema = OpSchema(
        op.name,
        op.domain,
        op.since_version,
        op.doc,
        inputs=[param(p) for p in op.inputs],
        outputs=[param(p) for p in op.outputs],
        type_constraints=[
            (c.name, [onnx_type_string(d) for d in c.dtypes], c.doc)
            for c in op.type_constraints
        ],
        attributes=[
            OpSchema.Attribute(a.name, onnx.helper.make_attribute(a.name, a.default), a.doc)
            for a in op.attributes
        ],
    )
    schema.set_type_and_shape_inference_function(_inference_for(op))
    return schema


_registered: list[OpVersion] = []


def register_all() -> None:
    """Register every op version with ONNX; already registered ones are left as they are."""
    for op in all_versions():
        if not onnx.defs.has(op.name, op.since_version, op.domain) or _registered_version(op) != op.since_version:
            onnx.defs.register_schema(to_onnx_schema(op))
            if not _registered:
                atexit.register(_deregister_all)
            _registered.append(op)


def _deregister_all() -> None:
    """Take our schemas out of ONNX's registry while Python is still alive.

    Each holds a Python shape-inference function; left in ONNX's static registry, it
    is destroyed after the interpreter has finalized, and with onnx 1.19 the process
    then hangs at exit instead of ending."""
    while _registered:
        op = _registered.pop()
        try:
            onnx.defs.deregister_schema(op.name, op.since_version, op.domain)
        except Exception:  # noqa: BLE001 - at exit, a schema already gone is fine
            pass


def _registered_version(op: OpVersion) -> int | None:
    try:
        return onnx.defs.get_schema(op.name, op.since_version, op.domain).since_version
    except onnx.defs.SchemaError:
        return None
