"""What several kinds' handlers check and write with: axes, broadcasting, the float dtypes."""
from __future__ import annotations

from dyndq.onednn.emitter import LOW_FLOATS, OpEmitter
from dyndq.onednn.handler import Attr
from dyndq.onednn.reader import show

FLOATS = {"float32"} | LOW_FLOATS
BROADCAST = Attr("auto_broadcast", "string", "numpy", ("numpy", "none"))


def axis_of(e: OpEmitter, key: str, value, rank: int) -> int:
    """`value` as an axis in [0, rank), or Refused naming `key`."""
    if isinstance(value, bool) or not isinstance(value, int) or not -rank <= value < max(rank, 1):
        e.refuse(key, show(value), f"an integer in [{-rank}, {rank - 1}]" if rank else
                 "0 (its tensor is of rank 0, a scalar: no other axis)")
    return value % rank if rank else 0


def per_axis_shape(rank: int, axis: int, n: int) -> list[int]:
    shape = [1] * rank
    shape[axis] = n
    return shape


def check_broadcast(e: OpEmitter, attrs: dict) -> None:
    """auto_broadcast 'none' takes inputs of one shape only."""
    if attrs["auto_broadcast"] == "none":
        shapes = {t.shape for t in e.op.inputs}
        if len(shapes) > 1:
            e.refuse("auto_broadcast", f"'none' with input shapes {[list(s) for s in sorted(shapes)]}",
                     "inputs of one shape (auto_broadcast='none' does not broadcast)")


def no_attrs_from_onnx(w) -> dict:
    """An ONNX node of no attributes the kind has a counterpart for."""
    if w.values:
        w.problem("attributes", f"{sorted(w.values)}", f"none: oneDNN's {w.kind} has no counterpart for them")
    return {}


def broadcast_from_onnx(w) -> dict:
    """An ONNX element-wise node broadcasts numpy-style."""
    return {**no_attrs_from_onnx(w), "auto_broadcast": "numpy"}
