"""ai.onnx ops as ONNX defines them, where `onnx.reference` computes something else.

The reference engine is `onnx.reference.ReferenceEvaluator`, whose results `dyndq run` gives and
`dyndq check --runtime-parity` takes as a model's meaning.  Run against ONNX's own backend node
tests and real models (docs/running.md, "Where onnx.reference is not ONNX"), it differs from ONNX
at a few ops and versions.  Each is either corrected here, an OpRun class the evaluator runs in
place of ONNX's (`CORRECTED`, handed to it as `new_ops`), or named in `UNTRUSTED`: ops whose
reference result is not trusted as the meaning (parity then takes ONNX Runtime with its graph
optimizations off as the meaning, and says why).

A corrected class runs only at the versions it corrects (`since_versions`, the since_version of
each ONNX schema it replaces, or None for all); at the others ONNX's own implementation runs, as
if it were not there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

__all__ = ["CORRECTED", "UNTRUSTED", "BatchNormalization", "CorrectedOp", "Hardmax", "LRN", "LogSoftmax",
           "LpNormalization", "OneHot", "RoiAlign", "Softmax", "Untrusted", "onnx_op", "untrusted_nodes",
           "untrusted_text"]


class CorrectedOp(OpRun):
    """An ai.onnx op computed here at the schema versions in `since_versions` (None: every one), by
    onnx.reference's own implementation at the others.  The node's schema (its attributes' defaults)
    is the one its scope's opset import resolves it to, as ONNX resolves it."""

    op_domain = ""
    op_schema = None
    since_versions: frozenset[int] | None = None

    def __init__(self, onnx_node, run_params, schema=None):
        opset = (run_params.get("opsets") or {}).get("", onnx.defs.onnx_opset_version())
        schema = onnx.defs.get_schema(onnx_node.op_type, opset, "")
        super().__init__(onnx_node, run_params, schema)
        self.since_version = schema.since_version
        self._delegate = None
        if self.since_versions is not None and self.since_version not in self.since_versions:
            from onnx.reference.ops import load_op

            cls = load_op("", onnx_node.op_type, opset, evaluator_cls=run_params.get("evaluator_cls"))
            self._delegate = cls(onnx_node, run_params)

    def run(self, *args, **kwargs):
        if self._delegate is not None:
            return self._delegate.run(*args, **kwargs)
        return super().run(*args, **kwargs)


def onnx_op(op: OpRun, version: int, drop: tuple[str, ...] = (), **attributes) -> OpRun:
    """onnx.reference's own implementation of `op`'s node at ai.onnx `version`, the node's attributes
    but `drop`, and `attributes` set: where an older version means what a newer one does with them."""
    from onnx.reference.ops import load_op

    node = onnx.NodeProto()
    node.CopyFrom(op.onnx_node)
    kept = [a for a in node.attribute if a.name not in drop and a.name not in attributes]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attributes.items())
    params = {**op.run_params, "opsets": {**(op.run_params.get("opsets") or {}), "": version}}
    return load_op("", node.op_type, version, evaluator_cls=params.get("evaluator_cls"))(node, params)


class BatchNormalization(CorrectedOp):
    """BatchNormalization-6, -7 and -9 (opsets 6 to 13), whose mode the node's outputs say: with one
    output (or -6's is_test=1) inference, y = scale * (x - mean) / sqrt(var + epsilon) + B with the
    mean and variance given; with more, training (the batch's statistics, and running ones updated
    with `momentum`).  onnx.reference computes training statistics at -9 whatever the node (it reads
    the schema's default momentum as a request for them) and at -6/-7 fails unless is_test=1.
    (From -14 on, `training_mode` says the mode and onnx.reference's own is right.)"""

    since_versions = frozenset({6, 7, 9})

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, is_test=None, spatial=None):
        from onnx.reference.ops.op_batch_normalization import _batchnorm_test_mode, _batchnorm_training_mode

        epsilon = 1e-5 if epsilon is None else epsilon
        outputs = [o for o in self.onnx_node.output if o]
        if len(outputs) == 1 or is_test:
            return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=epsilon),)
        # training: Y from the batch's mean and (population) variance, running ones moved by momentum,
        # as BatchNormalization-14 defines them; saved_mean and saved_var are the batch's (UNTRUSTED)
        y, saved_mean, saved_var, running_mean, running_var = _batchnorm_training_mode(
            x, scale, bias, mean, var, 0.9 if momentum is None else momentum, epsilon)
        return (y, running_mean, running_var, saved_mean, saved_var)[: len(self.onnx_node.output)]


class OneHot(CorrectedOp):
    """OneHot-9 and -11: `depth` a scalar or a one-element rank-1 tensor, cast to int64 when not of an
    integer type, as are non-integer `indices`; y = on_value where an index hits, off_value elsewhere,
    each value exactly as given.  Negative indices count from the end at -11 only: at -9 an index
    outside [0, depth) is all off_value.  onnx.reference fails on a rank-1 depth (tf2onnx writes
    one: magika's), wraps negative indices at -9, compares float indices uncast, and computes
    y * (on - off) + off, which rounds (on 0.1, off 0.3 gives 0.10000000000000003)."""

    def _run(self, indices, depth, values, axis=None):
        depth, indices, values = np.asarray(depth), np.asarray(indices), np.asarray(values)
        if depth.size != 1 or depth.ndim > 1:
            raise ValueError(f"OneHot: depth has shape {list(depth.shape)}; ONNX takes a scalar or a one-element "
                             "rank-1 tensor")
        if values.shape != (2,):
            raise ValueError(f"OneHot: values has shape {list(values.shape)}; ONNX takes [off_value, on_value]")
        n = int(depth.reshape(()).astype(np.int64))
        if indices.dtype.kind not in "iu":
            indices = indices.astype(np.int64)
        axis = -1 if axis is None else int(axis)
        rank = indices.ndim
        if axis < 0:
            axis += rank + 1
        if self.since_version >= 11:
            indices = np.where(indices < 0, indices + n, indices)
        hit = np.expand_dims(indices, axis) == np.arange(n).reshape((n,) + (1,) * (rank - axis))
        return (np.where(hit, values[1], values[0]).astype(values.dtype),)


class _Coerced2D(CorrectedOp):
    """Softmax, LogSoftmax and Hardmax before opset 13 (-1 and -11): the input is coerced to 2-D,
    [a_0 * ... * a_(axis-1), a_axis * ... * a_(n-1)], the op runs over its rows (the second axis),
    and the result takes the input's shape again; `axis` defaults to 1.  onnx.reference runs
    -13's meaning (over the one axis `axis`) at every version: another result wherever the axis
    is not the last (a [2, 3, 4] input with the default axis 1 moves by up to 0.55 in Softmax)."""

    since_versions = frozenset({1, 11})

    def _run(self, x, axis=None):
        axis = 1 if axis is None else int(axis)
        if not -x.ndim <= axis <= max(x.ndim - 1, 0):
            raise ValueError(f"{self.onnx_node.op_type}: axis {axis} out of range for an input of rank {x.ndim}")
        axis %= max(x.ndim, 1)
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        flat = x.reshape(rows, -1) if x.size else x.reshape(rows, int(np.prod(x.shape[axis:], dtype=np.int64)))
        # onnx.reference's own -13 along the last axis of the 2-D form: the meaning ONNX gives it
        (y,) = onnx_op(self, 13, axis=-1).run(flat)
        return (y.reshape(x.shape),)


class Softmax(_Coerced2D):
    __doc__ = _Coerced2D.__doc__


class LogSoftmax(_Coerced2D):
    __doc__ = _Coerced2D.__doc__


class Hardmax(_Coerced2D):
    __doc__ = _Coerced2D.__doc__


class LRN(CorrectedOp):
    """LRN-1 and -13: square_sum[n, c] sums X[n, i]^2 over the channels i from c - floor((size - 1) / 2)
    to c + ceil((size - 1) / 2) within [0, C - 1]; Y = X / (bias + alpha / size * square_sum)^beta.
    onnx.reference loops over the batch axis where it means the channels: with one image only
    channel 0 gets its sum, every other is divided by bias^beta (ONNX's own test passes by having
    as many images as channels)."""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):
        if x.ndim < 3:
            raise ValueError(f"LRN: X has rank {x.ndim}; ONNX takes [N, C, D1, ...]")
        channels = x.shape[1]
        below, above = (size - 1) // 2, -(-(size - 1) // 2)
        squares = x.astype(np.float64) ** 2  # (the sum in float64, as onnx.reference's other reductions round once)
        square_sum = np.zeros_like(squares)
        for c in range(channels):
            square_sum[:, c] = squares[:, max(0, c - below):min(channels, c + above + 1)].sum(axis=1)
        return ((x / (bias + (alpha / size) * square_sum) ** beta).astype(x.dtype),)


class LpNormalization(CorrectedOp):
    """LpNormalization-1 and -22: x / (sum over `axis` of |x|^p)^(1/p), p 1 or 2.  onnx.reference
    sums x^p without the absolute value: for p = 1 it divides by the signed sum (a [2, 3, 4]
    input moves by up to 13)."""

    def _run(self, x, axis=None, p=None):
        axis = -1 if axis is None else int(axis)
        p = 2 if p is None else int(p)
        if p not in (1, 2):
            raise ValueError(f"LpNormalization: p is {p}; ONNX takes 1 or 2")
        norm = np.sum(np.abs(x) ** p, axis=axis, keepdims=True) ** (1.0 / p)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.where(norm == 0, 0, x / norm).astype(x.dtype),)


class RoiAlign(CorrectedOp):
    """RoiAlign-10, which maps output pixels to input coordinates without the half-pixel offset
    (what -16 names coordinate_transformation_mode="output_half_pixel"; -16's default is
    "half_pixel").  onnx.reference runs -16's default at -10: another result (0.46 of 0.72 on a
    6x6 map)."""

    since_versions = frozenset({10})

    def _run(self, x, rois, batch_indices, **attributes):
        return onnx_op(self, 16, coordinate_transformation_mode="output_half_pixel").run(x, rois, batch_indices)


class _LegacyBroadcast(CorrectedOp):
    """A binary op before opset 7 (Add, Sub, Mul, Div at -1 and -6; Pow, And, Or, Xor, Equal,
    Greater, Less at -1): with broadcast=1, B is a scalar or a one-element tensor, or its shape is a
    contiguous run of A's dimensions, starting at `axis` (by default ending with A's last), and
    stretches over the others; without it, the shapes are equal.  onnx.reference broadcasts as
    NumPy does from -7 on, aligning B's last dimension with A's: A [3, 3] + B [3] with axis=0 adds
    B along the columns where ONNX adds it along the rows."""

    since_versions = frozenset({1, 6})

    def _run(self, a, b, broadcast=None, axis=None, consumed_inputs=None):
        a, b = np.asarray(a), np.asarray(b)
        if broadcast:
            if b.size == 1:
                b = b.reshape(())
            elif b.shape != a.shape:
                start = a.ndim - b.ndim if axis is None else int(axis) % max(a.ndim, 1)
                if a.shape[start:start + b.ndim] != b.shape:
                    raise ValueError(f"{self.onnx_node.op_type}: B's shape {list(b.shape)} is not A's dimensions "
                                     f"{list(a.shape)} from axis {start}")
                b = b.reshape(b.shape + (1,) * (a.ndim - start - b.ndim))
        elif a.shape != b.shape:
            raise ValueError(f"{self.onnx_node.op_type}: A {list(a.shape)} and B {list(b.shape)} differ, and "
                             "broadcast is 0")
        return onnx_op(self, 7, drop=("broadcast", "axis", "consumed_inputs")).run(a, b)


def _legacy(op_type: str) -> type[_LegacyBroadcast]:
    return type(op_type, (_LegacyBroadcast,), {"__doc__": _LegacyBroadcast.__doc__})


# The classes the reference engine runs in place of onnx.reference's.
CORRECTED: tuple[type[OpRun], ...] = (
    BatchNormalization, OneHot, Softmax, LogSoftmax, Hardmax, LRN, LpNormalization, RoiAlign,
    *(_legacy(op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")),
)


@dataclass(frozen=True)
class Untrusted:
    """An ai.onnx op whose reference result is not the meaning: at the schema versions in
    `since_versions` (all when empty), for the nodes `applies` to (all when None); `why` says so."""

    op_type: str
    since_versions: frozenset[int]
    why: str
    applies: Callable[[onnx.NodeProto], bool] | None = None

    def covers(self, node: onnx.NodeProto, since_version: int) -> bool:
        return ((not self.since_versions or since_version in self.since_versions)
                and (self.applies is None or self.applies(node)))


def _outputs(node: onnx.NodeProto) -> int:
    return sum(1 for o in node.output if o)


_RANDOM = "it draws random numbers: no engine's values are the model's meaning"

UNTRUSTED: tuple[Untrusted, ...] = (
    Untrusted("BatchNormalization", frozenset({6, 7, 9}),
              "in training mode (more than one output) before opset 14 ONNX does not define saved_mean and "
              "saved_var (ONNX Runtime gives the inverse standard deviation as saved_var, onnx.reference the variance)",
              lambda node: _outputs(node) > 1),
    Untrusted("Dropout", frozenset({7, 10}),
              "ONNX does not define the mask output's values outside training before opset 12 (ONNX Runtime gives "
              "all false, onnx.reference all true, and bool where -7 declares the input's type)",
              lambda node: _outputs(node) > 1),
    Untrusted("Scan", frozenset({8}),
              "onnx.reference runs Scan-9's meaning (no batch axis, no sequence_lens) for Scan-8"),
    *(Untrusted(op, frozenset(), _RANDOM) for op in ("Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                                                      "RandomUniform", "RandomUniformLike")),
)


def untrusted_nodes(model: onnx.ModelProto) -> list[tuple[object, Untrusted]]:
    """(site, entry) for each node of the model, in any scope, whose op the reference engine's result
    is not trusted for (`UNTRUSTED`), resolved by its scope's ai.onnx import."""
    from dyndq.plumbing.walk import walk

    by_op: dict[str, list[Untrusted]] = {}
    for entry in UNTRUSTED:
        by_op.setdefault(entry.op_type, []).append(entry)
    found = []
    for site in walk(model):
        node = site.node
        if node.domain not in ("", "ai.onnx") or node.op_type not in by_op:
            continue
        opset = site.opsets.get("", site.opsets.get("ai.onnx"))
        if opset is None:
            continue
        try:
            since = onnx.defs.get_schema(node.op_type, opset, "").since_version
        except onnx.defs.SchemaError:
            continue
        found += [(site, entry) for entry in by_op[node.op_type] if entry.covers(node, since)]
    return found


def untrusted_text(found: list[tuple[object, Untrusted]]) -> str:
    """What `untrusted_nodes` found, in a line: each op and version once, its nodes, and why."""
    groups: dict[tuple[str, str], list[str]] = {}
    for site, entry in found:
        opset = site.opsets.get("", site.opsets.get("ai.onnx"))
        version = onnx.defs.get_schema(site.node.op_type, opset, "").since_version
        groups.setdefault((f"{entry.op_type}-{version}", entry.why), []).append(site.node.name or site.node.output[0])
    parts = []
    for (op, why), nodes in groups.items():
        shown = ", ".join(repr(n) for n in nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        parts.append(f"{op} ({'node' if len(nodes) == 1 else f'{len(nodes)} nodes'} {shown}): {why}")
    return "; ".join(parts)
