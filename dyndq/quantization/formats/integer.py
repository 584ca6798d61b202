"""Integer codes of 2, 4 or 8 bits with per-group scales (and zero points unless symmetric): "int".

The numerics are numerics.py's (`quantize_weight`, by the method asked for: rtn.py, search.py);
the nodes are DynamicDequantize-2's (-3 for 2-bit codes) with a Cast to the weight's dtype
when the scales have another (rewrite.py).
"""
from __future__ import annotations

from dyndq.opdefs import Problem
from dyndq.quantization.formats.registry import Format, register
from dyndq.quantization.numerics import quantize_weight

DEFAULT_GROUP = 128  # the group size when none is given


class IntegerCodes(Format):
    name = "int"
    summary = "integer codes of --bits bits"
    bits = (4, 2, 8)  # (4: the default)
    default_group = DEFAULT_GROUP
    methods = None  # every method numerics has
    takes_scale_dtype = True
    choices = {"int2": 2, "int4": 4, "int8": 8}
    default_choice = True

    def fits(self, options, targets) -> list[Problem]:
        """A group longer than every weight's axis is refused before any work: a weight shorter
        than its group is padded to one group, and a group of 2**40 would be padded to that.
        Up to the default (128) a group is always taken, the longest axis beyond it."""
        longest = max(t.dims[t.axis] for t in targets)
        if options.group_size > max(longest, DEFAULT_GROUP):
            return [Problem("group_size", repr(options.group_size),
                            f"a whole number up to {max(longest, DEFAULT_GROUP)} (the longest axis a weight is "
                            "grouped along here), or -1 for one group per whole axis (per channel)")]
        return []

    def quantize(self, weight, target, options, bits: int):
        return quantize_weight(weight, axis=target.axis, group_size=options.group_size, bits=bits,
                               symmetric=options.symmetric, scale_dtype=options.scale_dtype or target.dtype,
                               method=options.method, rule=target.rule)

    def describe(self, options) -> str:
        kind = f"{'int' if options.symmetric else 'uint'}{options.bits}"
        group = "per channel" if options.group_size == -1 else f"groups of {options.group_size}"
        method = options.method + (" with scale estimation" if getattr(options, "scale_estimation", False) else "")
        return f"{kind} ({group}, {'symmetric' if options.symmetric else 'asymmetric'}, {method})"


INT = register(IntegerCodes())
