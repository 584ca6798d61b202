"""An engine's failure told as what a user can act on: the node, the op the engine has no way to
run there, and the way out (another engine, another form of the file).

ONNX Runtime says "Could not find an implementation for OP(VERSION) node with name 'NAME'" when
it has no kernel for the op at that version with the node's input types (DequantizeLinear-24 of
float4e2m1 codes, OneHot of int32 indices).  onnx.reference fails inside the Python code of its
op (a depth of shape [1] where its OneHot takes a scalar), which it wraps as "Issues with types
... (operator 'OP')"; the node and the values it was given are found in the traceback.  Any
other failure is told by `wording.engine_error` (the engine's own words, cleaned).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from dyndq.wording import engine_error, first_line

ORT_NO_KERNEL = re.compile(r"Could not find an implementation for ([\w.]+)\((\d+)\) node with name '([^']*)'")
ORT_NO_OP = re.compile(r"Fatal error: ([\w.]*):([\w.]+)\((-?\d+)\) is not a registered function/op")
WAY_OUT = {  # engine -> what runs the model instead
    "onnxruntime": "instead, run it on another engine (dyndq run --engine reference; OpenVINO: dyndq check "
                   "--runtime-parity --engine openvino)",
    "reference": "instead, run it on ONNX Runtime (dyndq run --engine onnxruntime)",
}
# ONNX Runtime's DequantizeLinear lacks some code and scale types (float4, float6, float8e8m0): dyndq writes other
# forms of the same values for it (docs/low-bit.md)
REWRITTEN_FOR_ORT = ("DequantizeLinear",)


@dataclass(frozen=True)
class Lacking:
    """A node an engine has no way to run: its op (version: ONNX Runtime's kernel's), the values
    it was given (dtype and, where known, shape), and why (onnx.reference's own error)."""

    engine: str  # "onnxruntime" or "reference"
    op: str
    node: str
    version: int | None = None
    given: str = ""  # "x float4e2m1, x_scale float8e8m0"
    why: str = ""

    def what(self) -> str:
        """What the engine lacks, without the way out."""
        given = f" ({self.given})" if self.given else ""
        if self.engine == "onnxruntime":
            import onnxruntime

            if not self.node:  # (an op of a domain it does not know: no kernel of any type)
                return f"ONNX Runtime {onnxruntime.__version__} does not know the op {self.op}"
            return (f"ONNX Runtime {onnxruntime.__version__} has no kernel for {self.op}-{self.version} with the "
                    f"input types of node {self.node!r}{given}")
        return f"onnx.reference's {self.op} cannot run node {self.node!r}{given}: {self.why}"

    def way_out(self) -> str:
        if self.engine == "onnxruntime" and not self.node:
            return "it runs only the ops it has, and those a custom op library registers with it"
        way = WAY_OUT[self.engine]
        if self.engine == "onnxruntime" and self.op in REWRITTEN_FOR_ORT:
            way += ("; or write it in a form ONNX Runtime runs: dyndq lift IN LIFTED.onnx, then dyndq export "
                    "LIFTED.onnx OUT --target onnxruntime (dyndq quantize: --emit onnxruntime)")
        return way

    def __str__(self) -> str:
        return f"{self.what()}; {self.way_out()}"


def lacking(e: BaseException, model=None) -> Lacking | None:
    """The node `e` says an engine has no way to run, or None for any other failure.  `model`:
    the model it was running (for the input types ONNX Runtime does not name)."""
    found = ORT_NO_KERNEL.search(str(e))
    if found:
        op, version, node = found.group(1), int(found.group(2)), found.group(3)
        return Lacking("onnxruntime", op, node, version, _declared_types(model, node, op))
    found = ORT_NO_OP.search(str(e))
    if found:
        return Lacking("onnxruntime", f"{found.group(1)}::{found.group(2)}" if found.group(1) else found.group(2), "")
    return _reference_failure(e)


def explained(e: BaseException, model=None) -> str:
    """`e` in one line for a user: the op the engine lacks and the way out, or the engine's own words."""
    found = lacking(e, model)
    return str(found) if found is not None else engine_error(e)


def _reference_failure(e: BaseException) -> Lacking | None:
    """The onnx.reference op that raised `e` (the innermost frame of an OpRun's own `run`), with the
    values it was given and its own error; None when no op raised it."""
    try:
        from onnx.reference.op_run import OpRun
    except ImportError:  # (an onnx without the reference evaluator: no such failure)
        return None
    tb, found = e.__traceback__, None
    while tb is not None:
        frame = tb.tb_frame
        op = frame.f_locals.get("self")
        if isinstance(op, OpRun) and frame.f_code.co_name == "run" and getattr(op, "onnx_node", None) is not None:
            found = (op, frame.f_locals.get("args") or ())
        tb = tb.tb_next
    if found is None:
        return None
    op, args = found
    node = op.onnx_node
    if node.domain not in ("", "ai.onnx", "ai.onnx.ml"):  # (ours, a function: told by their own errors)
        return None
    cause = e.__cause__ if isinstance(e, TypeError) and str(e).startswith("Issues with types") and e.__cause__ else e
    given = ", ".join(f"{name} {_value(value)}" for name, value in zip(node.input, args) if name)
    return Lacking("reference", node.op_type, node.name or node.output[0], given=given, why=first_line(cause).rstrip("."))  # (';' follows it)


def _value(value) -> str:
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    return f"{dtype}{list(shape)}" if dtype is not None and shape is not None else type(value).__name__


def _declared_types(model, node_name: str, op: str) -> str:
    """"x float4e2m1, x_scale float8e8m0": the dtypes of the node's inputs, as ONNX infers them ("" without a model)."""
    if model is None:
        return ""
    from dyndq.plumbing.types import spec_of_type
    from dyndq.plumbing.walk import walk
    from dyndq.scopes import value_types

    site = next((s for s in walk(model) if s.node.name == node_name and s.node.op_type == op), None)
    if site is None:
        return ""
    try:
        seen = value_types(model).at(site.graph)
    except Exception:  # noqa: BLE001 - a model ONNX cannot infer: the types are left out
        return ""
    specs = [(name, spec_of_type(seen.get(name))) for name in site.node.input if name]
    return ", ".join(f"{name} {spec.dtype}" for name, spec in specs if spec is not None and spec.dtype)
