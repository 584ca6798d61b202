"""Where each element's parameters are: the geometry every path of the kernel shares.

DynamicDequantize's parameters broadcast over src once src is viewed in the right shape:
per_group (d0, d1) with groups (g0, g1) as (d0/g0, g0, d1/g1, g1), parameters (d0/g0, 1,
d1/g1, 1); per_channel along axis a as (pre, C, post), parameters (1, C, 1); per_tensor as
one run.  Size-1 dims are dropped and neighbours of one kind merged, so the view has as few
dims as the form allows.  The NumPy kernel blocks by this view, the compiled kernel walks it.
"""
from __future__ import annotations

import math

from dyndq.opdefs import PER_GROUP, PER_TENSOR

__all__ = ["view", "param_count", "param_shape", "param_index"]


def view(shape, qtype, axis, group_shape):
    """A shape src can be viewed in (C order), and for each of its dims whether the
    parameters vary along it (else they broadcast)."""
    if qtype == PER_TENSOR or len(shape) == 0:
        dims = [(d, False) for d in shape]
    elif qtype == PER_GROUP:
        dims = [x for d, g in zip(shape, group_shape) for x in ((d // int(g), True), (int(g), False))]
    else:
        a = axis % len(shape)
        dims = [(d, i == a) for i, d in enumerate(shape)]
    merged: list[list] = []
    for d, v in dims:
        if d == 1:
            continue  # a size-1 dim: nothing varies along it
        if merged and merged[-1][1] == v:
            merged[-1][0] *= d  # neighbours of one kind: C order lets them merge
        else:
            merged.append([d, v])
    if not merged:
        merged = [[1, False]]
    return tuple(d for d, _ in merged), tuple(v for _, v in merged)


def param_count(vshape, varies) -> int:
    """How many parameters a view (view's result) has: the product of the dims they vary along."""
    return math.prod(d for d, v in zip(vshape, varies) if v)


def param_shape(vshape, varies) -> tuple:
    """The parameters' shape in the view: their dims where they vary, 1 where they broadcast."""
    return tuple(d if v else 1 for d, v in zip(vshape, varies))


def param_index(idx, varies) -> tuple:
    """The parameters' part of a block of the view (idx: ints and slices, one per dim)."""
    return tuple(i if v else (0 if isinstance(i, int) else slice(None)) for i, v in zip(idx, varies))
