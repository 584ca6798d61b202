"""`example_inputs(model, seed)`: one array per graph input, with values a real run could see.

What an input is for decides its values: each oneDNN kind's handler holds the rule for
its inputs (`Handler.example`: a dequantization's scales and zero points, a divisor, the
src of Sqrt, the weights of a MatMul ...), and an input no rule speaks for gets the
default: a random mask for bool, integers over the dtype's whole range, N(0, 1) for floats
(activations).  A rule sees the op the input feeds and the ops that use that op's outputs
(`Draw.uses`), so that values can follow what they flow into: the weights of a linear
layer (a rank-2 second operand of a MatMul) have the magnitude 1/sqrt(K) initialisers give
them, so that activations keep their magnitude through a MatMul of reduction length K.
The ops are read from their metadata (models made by `load`) or, for other models, from the
nodes through the handlers' inverse table.  The same seed gives the same arrays.

Inputs that together would take more than `max_bytes` are refused, naming the largest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from dyndq.plumbing.types import spec_of_type
from dyndq.onednn.kinds import KINDS, inverse_table
from dyndq.onednn.metadata import op_entry
from dyndq.opdefs import Problem, ValidationError, dtypes

MAX_BYTES = 4 * 2**30  # the default budget of example_inputs: 4 GiB of arrays


@dataclass(frozen=True)
class Use:
    """One op as example-input rules see it: its kind, attributes and value names."""

    kind: str
    attrs: dict
    inputs: list[str]
    outputs: list[str]


def _ops(model: onnx.ModelProto) -> list[Use]:
    inverse = inverse_table()
    ops = []
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if "onednn.op" in meta:
            try:
                entry = op_entry(meta["onednn.op"])
            except ValueError:  # metadata not as load writes it: no rule speaks for the op's inputs
                continue
            attrs = {k: v["value"] for k, v in entry["attrs"].items()}
            ops.append(Use(entry["kind"], attrs, entry["input_names"], entry["output_names"]))
        elif node.op_type in inverse and "onednn.id" not in meta:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            ops.append(Use(inverse[node.op_type].kind, attrs, list(node.input), list(node.output)))
    return ops


class Draw:
    """What an example-input rule draws with: one input's dtype and shape, the op it feeds
    (`op`, at input `index`), the graph inputs' specs, and who uses each value (`uses`)."""

    def __init__(self, rng, dtype: dtypes.DType, shape, op: Use | None, index: int | None, specs: dict, users: dict):
        self.rng, self.dtype, self.shape, self.op, self.index = rng, dtype, shape, op, index
        self.specs, self.users = specs, users

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def names(self) -> list[str]:
        return self.op.inputs if self.op else []

    def input_dtype(self, i: int) -> dtypes.DType | None:
        spec = self.specs.get(self.names[i]) if i < len(self.names) else None
        return dtypes.by_name(spec.dtype) if spec is not None and spec.dtype else None

    def output_dtype(self, i: int) -> dtypes.DType | None:
        outputs = self.op.outputs if self.op else []
        spec = self.specs.get(outputs[i]) if i < len(outputs) else None
        return dtypes.by_name(spec.dtype) if spec is not None and spec.dtype else None

    def input_shape(self, i: int) -> tuple | None:
        spec = self.specs.get(self.names[i]) if i < len(self.names) else None
        return tuple(spec.shape) if spec is not None and spec.shape is not None else None

    def uses(self, value: str) -> list[tuple[Use, int]]:
        """The ops that take `value`, each with the input index it goes to."""
        return self.users.get(value, [])

    def downstream(self) -> set[str]:
        """The kinds of the ops that take this op's outputs."""
        return {use.kind for out in (self.op.outputs if self.op else []) for use, _ in self.uses(out)}

    def integers(self, lo=None, hi=None) -> np.ndarray:
        a, b = dtypes.integer_range(self.dtype)
        lo, hi = max(a, lo if lo is not None else a), min(b, hi if hi is not None else b)
        draw = np.int16 if self.dtype.bits <= 8 else np.int64  # a quarter of the memory for the big int4 weights
        return self.rng.integers(lo, hi + 1, size=self.shape, dtype=draw).astype(self.dtype.numpy)

    def floats(self, lo=None, hi=None, std=None) -> np.ndarray:
        """N(0, 1) (or N(0, std^2)), or uniform in [lo, hi)."""
        if lo is None:
            values = self.rng.standard_normal(self.shape)
            if std is not None:
                values *= std
        else:
            values = self.rng.uniform(lo, hi, size=self.shape)
        return values.astype(np.float32).astype(self.dtype.numpy)

    def full(self, value) -> np.ndarray:
        return np.full(self.shape, value, np.float32).astype(self.dtype.numpy)


def example_input(rng, dtype: dtypes.DType, shape, role, specs, users) -> np.ndarray:
    op, index = role if role else (None, None)
    if dtype.name == "bool":
        return rng.random(shape) < 0.5
    draw = Draw(rng, dtype, shape, op, index, specs, users)
    rule = KINDS[op.kind].example if op is not None and op.kind in KINDS else None
    value = rule(index, draw) if rule is not None else None
    if value is not None:
        return value
    return draw.integers() if dtype.is_integer else draw.floats()


def _problem(name: str, found: str, allowed: str) -> Problem:
    return Problem(f"input {name}", found, allowed)


def example_inputs(model: onnx.ModelProto, seed: int = 0, max_bytes: int = MAX_BYTES) -> dict[str, np.ndarray]:
    """name -> array for every graph input that is not an initializer (see the module doc).
    ValidationError, naming the input, for an input of unknown dtype or shape, and for inputs
    that would take more than `max_bytes` together (naming the largest), and for a seed that is not
    a whole number >= 0 (NumPy's generators take no other)."""
    import numbers

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValidationError([Problem("seed", repr(seed), "a whole number >= 0")])
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    specs = {vi.name: spec_of_type(vi.type) for vi in [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    ops = _ops(model)
    roles: dict[str, tuple[Use, int]] = {}
    users: dict[str, list[tuple[Use, int]]] = {}
    for op in ops:
        for i, name in enumerate(op.inputs):
            roles.setdefault(name, (op, i))
            users.setdefault(name, []).append((op, i))
    wanted, problems, sizes = [], [], {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        spec = specs[vi.name]
        if spec is None or spec.dtype is None or spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
            problems.append(_problem(vi.name, f"{spec}", "a known dtype and shape (example inputs are made from them)"))
            continue
        row = dtypes.by_name(spec.dtype)
        sizes[vi.name] = int(np.prod(spec.shape, dtype=object)) * max(row.bits, 8) // 8
        wanted.append((vi.name, row, tuple(spec.shape)))
    total = sum(sizes.values())
    if not problems and total > max_bytes:
        name = max(sizes, key=sizes.get)
        problems.append(_problem(name, f"{sizes[name]:,} bytes ({total:,} for every input together)",
                                 f"inputs of at most {max_bytes:,} bytes together (max_bytes, --max-input-bytes)"))
    if problems:
        raise ValidationError(problems)
    return {name: example_input(rng, row, shape, roles.get(name), specs, users) for name, row, shape in wanted}
