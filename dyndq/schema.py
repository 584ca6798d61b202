"""Each registered op version, as an `onnx.defs.OpSchema` registered with ONNX.

Registration is what makes `onnx.checker.check_model(full_check=True)` and
`onnx.shape_inference.infer_shapes(strict_mode=True)` understand our ops: ONNX
checks the type constraints itself and calls our Python shape function.
`sync()` keeps ONNX's registry in step with ours; it runs whenever ours changes.
`schema_text()` is the same schemas written for a reader (what `dyndq schema` prints).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import textwrap
import threading

import onnx
import onnx.defs
from onnx.defs import OpSchema
from onnx.shape_inference import InferenceError

from dyndq.opdefs import OpVersion, TensorSpec, ValidationError, all_versions
from dyndq.opdefs import registry
from dyndq.plumbing.types import (SCHEMA_ATTR_TYPE, attribute_type_name, attribute_value, make_attribute,
                                  onnx_type_string, spec_of_type, type_of_spec, untyped_tensor)
from dyndq.wording import table

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
    def infer(ctx) -> None:
        specs = []
        for i, param in enumerate(op.inputs):
            # (onnx < 1.22's has_input is False for an input present with no type: a required
            # input is present whenever the node has that many inputs)
            present = i < ctx.get_num_inputs() and (ctx.has_input(i) or not param.optional)
            tp = ctx.get_input_type(i) if present else None
            known = tp is not None and not untyped_tensor(tp)  # (an UNDEFINED element type: unknown)
            specs.append(((spec_of_type(tp) if known else None) or TensorSpec(None, None)) if present else None)
        attrs = op.defaults()
        for a in op.attributes:
            proto = ctx.get_attribute(a.name)
            if proto is not None:
                attrs[a.name] = attribute_value(proto)
            elif a.required:
                return  # ONNX's checker names a missing required attribute itself
        try:
            out = op.shape_inference(*specs, **attrs)
        except ValidationError as e:
            if getattr(_state, "lenient", False):
                return
            raise InferenceError(f"{MARK} {ctx.get_display_name()}: {e}") from None
        if out.dtype is not None:  # (an input of unknown type leaves the output's unknown too)
            ctx.set_output_type(0, type_of_spec(out, like=ctx.get_input_type(0)))

    return infer


_PARAM = OpSchema.FormalParameter
_OPTION = OpSchema.FormalParameterOption


def _attribute(a) -> OpSchema.Attribute:
    if a.has_default:
        return OpSchema.Attribute(a.name, make_attribute(a.name, a.default, a.kind), a.doc)
    return OpSchema.Attribute(a.name, SCHEMA_ATTR_TYPE[a.kind], a.doc, required=a.required)


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
        type_constraints=[(c.name, [onnx_type_string(d) for d in c.dtypes], c.doc) for c in op.type_constraints],
        attributes=[_attribute(a) for a in op.attributes],
    )
    schema.set_type_and_shape_inference_function(_inference_for(op))
    return schema


_registered: dict[tuple[str, str, int], OpVersion] = {}
_lock = threading.Lock()


def sync() -> None:
    """Register with ONNX every op version of ours it lacks; deregister those we registered
    that have left our registry (a test's scoped toy ops)."""
    with _lock:
        current = {op.key: op for op in all_versions()}
        for key, op in list(_registered.items()):
            if current.get(key) is not op:
                _deregister(op)
                del _registered[key]
        for key, op in current.items():
            if key not in _registered and _registered_version(op) != op.since_version:
                onnx.defs.register_schema(to_onnx_schema(op))
                _registered[key] = op


def register_all() -> None:
    """Register every op version with ONNX now, and again whenever our registry changes."""
    registry.subscribe(sync)
    sync()


def _deregister(op: OpVersion) -> None:
    try:
        onnx.defs.deregister_schema(op.name, op.since_version, op.domain)
    except Exception:  # noqa: BLE001 - a schema already gone is fine
        pass


@atexit.register
def _deregister_all() -> None:
    """Take our schemas out of ONNX's registry while Python is still alive.

    Each holds a Python shape-inference function; left in ONNX's static registry, it
    is destroyed after the interpreter has finalized, and with onnx 1.19 the process
    then hangs at exit instead of ending."""
    with _lock:
        while _registered:
            _, op = _registered.popitem()
            _deregister(op)


def _registered_version(op: OpVersion) -> int | None:
    try:
        return onnx.defs.get_schema(op.name, op.since_version, op.domain).since_version
    except onnx.defs.SchemaError:
        return None


def schema_text() -> str:
    """Every registered op version as readable tables: inputs, outputs, attributes with their
    defaults and allowed values, type constraints."""
    blocks = []
    for op in all_versions():
        lines = [f"{op.qualname}, version {op.since_version}"]
        lines += textwrap.wrap(op.doc, width=88, initial_indent="  ", subsequent_indent="  ")
        lines += ["", "inputs"]
        lines += table(
            ["name", "type", "use", "description"],
            [[p.name, p.type_var, "optional" if p.optional else "required", p.doc] for p in op.inputs],
        )
        lines += ["", "outputs"]
        lines += table(["name", "type", "description"], [[p.name, p.type_var, p.doc] for p in op.outputs])
        lines += ["", "attributes"]
        lines += table(
            ["name", "type", "default", "allowed", "description"],
            [
                [
                    a.name,
                    attribute_type_name(a.kind),
                    "(required)" if a.required else ("(none)" if a.default is None else json.dumps(a.default)),
                    " | ".join(json.dumps(v) for v in a.allowed) if a.allowed else "",
                    a.doc,
                ]
                for a in op.attributes
            ],
        )
        lines += ["", "type constraints"]
        lines += table(["name", "types", "description"], [[c.name, ", ".join(c.dtypes), c.doc] for c in op.type_constraints])
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
