"""The options of `dyndq.quantize` as one type: `QuantizeOptions`, judged once.

`QuantizeOptions.checked(model, bits=..., ...)` takes the function's keyword arguments, names
every bad one as a `Problem` of one `OptionError`, and returns them normalized (ints, bools, a
dtype's name, tuples of names); the quantizer reads nothing else.  `settings()` writes the ones
that shape the quantized model out for the report (its `settings`, the CLI's --json).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from dyndq.opdefs import Problem, ValidationError
from dyndq.quantization import plan as planning
from dyndq.quantization.numerics import METHODS

SCALE_DTYPES = ("float32", "float16", "bfloat16")


class OptionError(ValidationError):
    """Options `quantize` cannot work with (a group size of 0, an op it does not quantize, a
    name the model does not hold): a mistake in the call, not in the model (the CLI: exit 2)."""


@dataclass(frozen=True)
class QuantizeOptions:
    """How to quantize a model (see `dyndq.quantize` for each)."""

    bits: int = 4
    group_size: int = 128  # -1: one group per whole axis (per channel)
    symmetric: bool = False
    scale_dtype: str | None = None  # None: each weight's own dtype
    ops: tuple[str, ...] = planning.OPS
    exclude: tuple[str, ...] = ()  # node or weight names
    method: str = "rtn"
    seed: int = 0  # of the random inputs the output error is measured on

    @classmethod
    def checked(cls, model, *, bits=4, group_size=128, symmetric=False, scale_dtype=None, ops=planning.OPS,
                exclude=(), method="rtn", seed=0) -> QuantizeOptions:
        """The options for `model` (whose node and weight names `exclude` must name), or
        OptionError naming every bad one."""
        problems = []

        def bad(argument, found, allowed):
            problems.append(Problem(argument, found, allowed))

        if isinstance(bits, bool) or bits not in (4, 8):
            bad("bits", repr(bits), "4 or 8")
        if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or \
                not (group_size >= 1 or group_size == -1):
            bad("group_size", repr(group_size), "a whole number >= 1, or -1 for one group per whole axis (per channel)")
        if not isinstance(symmetric, (bool, np.bool_)):
            bad("symmetric", repr(symmetric), "True or False")
        name = None
        if scale_dtype is not None:
            try:
                name = np.dtype(scale_dtype).name
            except TypeError:
                name = repr(scale_dtype)
            if name not in SCALE_DTYPES:
                bad("scale_dtype", repr(scale_dtype), ", ".join(SCALE_DTYPES) + " (or None: each weight's own dtype)")
        if method not in METHODS:
            bad("method", repr(method), ", ".join(METHODS))
        ops = (ops,) if isinstance(ops, str) else tuple(ops)
        for op in ops:
            if op not in planning.OPS:
                bad("ops", repr(op), ", ".join(planning.OPS))
        if not ops:
            bad("ops", "no op", "one or more of " + ", ".join(planning.OPS))
        exclude = (exclude,) if isinstance(exclude, str) else tuple(exclude)
        nodes, weights = planning.names_of(model)
        for x in exclude:
            if x not in nodes and x not in weights:
                bad("exclude", repr(x), "the name of a node or a weight (initializer) of the model")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            bad("seed", repr(seed), "a whole number >= 0")
        if problems:
            raise OptionError(problems)
        return cls(bits=int(bits), group_size=int(group_size), symmetric=bool(symmetric), scale_dtype=name, ops=ops,
                   exclude=exclude, method=method, seed=int(seed))

    def settings(self) -> dict:
        """The options that shape the quantized model, as the report writes them (the seed, which
        only the output error uses, left out)."""
        return dict(bits=self.bits, group_size=self.group_size, symmetric=self.symmetric, scale_dtype=self.scale_dtype,
                    ops=list(self.ops), exclude=list(self.exclude), method=self.method)
