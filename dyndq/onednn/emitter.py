"""What a kind's mapping writes with: ONNX nodes for one oneDNN op, tagged with the op's id.

Every node a mapping writes carries `onednn.id` in its metadata; the op's main node
(the one that keeps the op's name) also carries `onednn.op`, the op as JSON (kind,
attributes, tensor ids), so that `dump` can write the op back as it was.

float16 and bfloat16 arithmetic is written as float32 arithmetic between exact Casts
(`float_op`): ONNX Runtime's CPU has no bfloat16 kernels for these ops and runs its
float16 ones by inserting the same Casts itself; one rounding to the output dtype
at the end is what oneDNN's kernels do too (they compute in float32 and round once).
For + - * / max min sqrt the result is then exactly the IEEE float16/bfloat16 result.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dyndq.opdefs import Problem, dtypes
from dyndq.onednn.reader import Op, Tensor

FLOAT32 = dtypes.by_name("float32")
LOW_FLOATS = {"float16", "bfloat16"}
FLOAT8 = {"float8_e4m3fn", "float8_e5m2"}  # oneDNN's f8_e4m3 and f8_e5m2 (finite-only e4m3, IEEE-like e5m2)
WIDENS_EXACTLY = LOW_FLOATS | FLOAT8 | {"int32"}  # to float32 by a Cast (int32: exact within 2^24)
NAME_BASE = 64  # characters of an op's name that the names of its values keep (they are file names, too)


class Refused(Exception):
    """The op cannot be mapped; its problems are in the OpEmitter."""


class OpEmitter:
    def __init__(self, op: Op, names: dict[int, str], taken: set[str], node_name: str | None = None,
                 position: int | None = None):
        self.op = op
        self.position = position  # the op's place in the file's list of ops (dump writes them in that order)
        self.node_name = op.name if node_name is None else node_name  # unique in the graph, as ONNX Runtime asks
        self.names = names
        self.taken = taken
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.problems: list[Problem] = []
        self._main_done = False
        self.views: dict[int, str] = {}  # input index -> the value to read it as (see view())

    # -- judging ------------------------------------------------------------------------

    def problem(self, argument, found, allowed) -> None:
        self.problems.append(self.op.problem(argument, found, allowed))

    def refuse(self, argument, found, allowed):
        self.problem(argument, found, allowed)
        raise Refused()

    def arity(self, inputs: tuple[int, int], outputs: tuple[int, int]) -> None:
        """How many inputs and outputs, each (least, most); Refused when out of range."""
        for side, (lo, hi) in (("inputs", inputs), ("outputs", outputs)):
            n = len(getattr(self.op, side))
            if not lo <= n <= hi:
                self.problem(side, f"{n} {side}", f"{lo}" if lo == hi else f"{lo} to {hi}")
        if self.problems:
            raise Refused()

    def dtype_in(self, tensor: Tensor, where: str, allowed: set[str]) -> None:
        if tensor.dtype.name not in allowed:
            names = ", ".join(sorted(dtypes.by_name(n).onednn for n in allowed))
            self.problem(where, f"dtype {tensor.dtype.onednn}", names)

    # -- names --------------------------------------------------------------------------

    def input(self, i: int) -> str:
        return self.views.get(i) or self.names[self.op.inputs[i].id]

    def view(self, i: int, shape: tuple[int, ...]) -> None:
        """Read input i as this op describes it: the same elements as its producer gave them, in
        another shape (oneDNN lets descriptions of one tensor differ so: a [256, 1] MatMul dst
        taken as [256])."""
        self.views[i] = self.node("Reshape", [self.names[self.op.inputs[i].id],
                                              self.const(list(shape), "int64", f"in{i}_view_shape")], what=f"in{i}_view")

    def output(self, i: int = 0) -> str:
        return self.names[self.op.outputs[i].id]

    def temp(self, what: str) -> str:
        base = f"{(self.node_name or self.op.kind)[:NAME_BASE]}/{what}"
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    # -- writing ------------------------------------------------------------------------

    def node(self, op_type: str, inputs: list[str], output: str | None = None, *, main=False, domain="",
             what: str | None = None, **attrs) -> str:
        """One node; returns its output's name (a fresh one unless `output` is given)."""
        output = output or self.temp(what or op_type.lower())
        name = self.node_name if main and not self._main_done else self.temp(f"{what or op_type.lower()}_node")
        node = helper.make_node(op_type, inputs, [output], name=name, domain=domain, **attrs)
        self.tag(node, main)
        self.nodes.append(node)
        return output

    def tag(self, node: onnx.NodeProto, main: bool) -> None:
        if not main or self._main_done:
            node.metadata_props.add(key="onednn.id", value=str(self.op.id))
        else:
            self._main_done = True
            entry = {"id": self.op.id, "name": self.op.name, "kind": self.op.kind,
                     "attrs": {k: {"type": self.op.attr_types.get(k, ""), "value": v} for k, v in self.op.attrs.items()},
                     "inputs": [t.id for t in self.op.inputs], "outputs": [t.id for t in self.op.outputs],
                     "input_names": [self.names[t.id] for t in self.op.inputs],
                     "output_names": [self.names[t.id] for t in self.op.outputs]}
            if self.position is not None:
                entry["position"] = self.position
            # how this op describes each of its tensors (dump writes it back where the shape is that one)
            entry["layouts"] = [[list(t.shape), list(t.stride), t.layout_type, t.property_type]
                                for t in self.op.inputs + self.op.outputs]
            node.metadata_props.add(key="onednn.id", value=str(self.op.id))
            node.metadata_props.add(key="onednn.op", value=json.dumps(entry, separators=(",", ":")))

    def const(self, values, dtype: str, what: str = "const") -> str:
        name = self.temp(what)
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=dtypes.by_name(dtype).numpy), name))
        return name

    def cast(self, name: str, dtype: dtypes.DType, what="cast") -> str:
        return self.node("Cast", [name], what=what, to=dtype.onnx)

    def f32(self, i: int) -> str:
        """Input i as float32 (an exact Cast from float16/bfloat16)."""
        t = self.op.inputs[i]
        if t.dtype.name == "float32":
            return self.input(i)
        if t.dtype.name not in WIDENS_EXACTLY:
            self.refuse(f"inputs[{i}]", f"dtype {t.dtype.onednn}", "f32, f16, bf16")
        return self.cast(self.input(i), FLOAT32, what=f"in{i}_f32")

    def finish(self, value: str, op_type: str, inputs: list[str], out: int = 0, **attrs) -> None:
        """`op_type` in float32 as the main node, then one rounding to output `out`'s dtype."""
        dst = self.op.outputs[out]
        if dst.dtype.name == "float32":
            self.node(op_type, inputs, self.output(out), main=True, **attrs)
        else:
            if dst.dtype.name not in LOW_FLOATS | FLOAT8:
                self.refuse(f"outputs[{out}]", f"dtype {dst.dtype.onednn}", "f32, f16, bf16")
            tmp = self.node(op_type, inputs, main=True, what=f"{value}_f32", **attrs)
            self.node("Cast", [tmp], self.output(out), what="round_to_dst", to=dst.dtype.onnx)

    def float_op(self, op_type: str, inputs: list[int], **attrs) -> None:
        self.finish("dst", op_type, [self.f32(i) for i in inputs], **attrs)
