"""The registry of quantization formats and what a format is (`Format`); formats/__init__.py says more."""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from dyndq.opdefs import Problem

_FORMATS: dict[str, "Format"] = {}


class Format:
    """One quantization format (see the module doc); the defaults are integer codes' ways."""

    name: str = ""
    summary: str = ""  # a few words for --help and the docs
    bits: tuple[int, ...] = ()  # the code widths it takes (the first: its default when bits is not given)
    block: int | None = None  # its one group size (None: any, `default_group` when none is given)
    default_group: int = 128
    methods: tuple[str, ...] | None = ("rtn",)  # the methods it takes (None: every one numerics.METHODS has)
    takes_scale_dtype: bool = False
    codes_words: str = ""  # what its codes are, for a refusal of bits: "float4e2m1"
    scales_words: str = ""  # what its scales are, for a refusal of scale_dtype: "float8e8m0"
    choices: dict[str, int] = {}  # what a budget may choose of it: choice name -> bits
    default_choice: bool = False  # whether a budget chooses among its choices when none are given
    writes_dtype: bool = False  # its DynamicDequantize writes the weight's dtype (output_dtype), no Cast after

    # -- its option checks ------------------------------------------------------------------

    def problems(self, *, bits: int, group_size, scale_dtype, method: str) -> list[Problem]:
        """Why these options (bits and method given or their defaults, group_size and scale_dtype
        None when not given) do not fit the format: what differs from its own is a mistake."""
        out = []
        fmt = repr(self.name)
        if self.block is not None and group_size is not None and group_size != self.block:
            out.append(Problem("group_size", f"{group_size!r} with format {fmt}", f"{self.block} (its blocks) or none given"))
        if bits not in self.bits and bits in all_bits():
            out.append(Problem("bits", f"{bits!r} with format {fmt}",
                               f"{_either(self.bits)} (its codes are {self.codes_words}) or none given"))
        if not self.takes_scale_dtype and scale_dtype is not None:
            out.append(Problem("scale_dtype", f"{scale_dtype!r} with format {fmt}", f"none (its scales are {self.scales_words})"))
        if self.methods is not None and method not in self.methods:
            out.append(Problem("method", f"{method!r} with format {fmt}",
                               f"{_either([repr(m) for m in self.methods])} (the format's rule is the only method)"))
        return out

    def group_size(self, given: int | None) -> int:
        """The group size the format quantizes with: its block, or the one given, or its default."""
        if self.block is not None:
            return self.block
        return self.default_group if given is None else given

    def fits(self, options, targets) -> list[Problem]:
        """Why the options do not fit the weights found (plan.Target), before any work (none by default)."""
        return []

    # -- its quantize and dequantize --------------------------------------------------------------

    def quantize(self, weight: np.ndarray, target, options, bits: int):
        """`weight` (of plan.Target `target`) in this format at `bits` bits, with `options`
        (QuantizeOptions): a numerics.QuantizedWeight whose `format` is this format's name."""
        raise NotImplementedError(f"format {self.name!r} has no quantize")

    def dequantize(self, q, dtype) -> np.ndarray:
        """The weight the graph gives back for `q` (the nodes `nodes` writes: our kernel, then
        the Slice and the weight's dtype)."""
        from dyndq.kernels.dynamic_dequantize import dynamic_dequantize
        from dyndq.plumbing.types import elem_type

        values = dynamic_dequantize(q.codes, self.dequantized_scales(q), q.zero_points, qtype="per_group",
                                    group_shape=q.group_shape,
                                    output_dtype=elem_type(np.dtype(dtype).name) if self.writes_dtype else None)
        values = np.take(values, np.arange(q.length), axis=q.axis) if q.padded_to else values
        return values.astype(dtype)

    def dequantized_scales(self, q) -> np.ndarray:
        """The scales the codes are dequantized with (NVFP4's are dequantized first)."""
        return q.scales

    # -- the nodes it writes ----------------------------------------------------------------------

    def nodes(self, name: str, dtype: str, q, names, opset: int):
        """rewrite.Placed: the tensors and nodes for weight `name` (of `dtype`) quantized as `q`."""
        from dyndq.quantization.rewrite import placed

        return placed(self, name, dtype, q, names, opset)

    def form(self, q) -> str:
        """What its codes are, first in the form the report gives each weight: "uint4"."""
        return q.codes.dtype.name

    def scale_inputs(self, name: str, q, scales: str, scale_array, names, tensors: list, nodes: list) -> None:
        """Make the value `scales` the DynamicDequantize of the codes reads: by default one tensor
        of `scale_array` (NVFP4 writes a node that dequantizes its block scales into it)."""
        from onnx import numpy_helper

        tensors.append(numpy_helper.from_array(scale_array, scales))

    def describe(self, options) -> str:
        """The format as the report's summary names it: "mxfp4 (blocks of 32)", "uint4 (groups of 128, asymmetric, rtn)"."""
        return f"{self.name} (blocks of {options.group_size})" if self.block is not None else self.name


def register(fmt: Format) -> Format:
    """Add a format to the registry (a module's `register(MyFormat())`); a name taken is refused."""
    if not fmt.name or fmt.name in _FORMATS:
        raise ValueError(f"format {fmt.name!r}: {'registered already' if fmt.name else 'a format needs a name'}")
    clash = set(fmt.choices) & {c for f in _FORMATS.values() for c in f.choices}
    if clash:
        raise ValueError(f"format {fmt.name!r}: budget choices {sorted(clash)} are another format's")
    _FORMATS[fmt.name] = fmt
    return fmt


def methods_of(fmt: Format) -> tuple[str, ...]:
    from dyndq.quantization.numerics import METHODS

    return tuple(METHODS) if fmt.methods is None else fmt.methods


def get(name: str) -> Format:
    """The format registered as `name` (KeyError when none is)."""
    return _FORMATS[name]


def names() -> tuple[str, ...]:
    """Every format's name, in registration order."""
    return tuple(_FORMATS)


def of(q) -> Format:
    """The format a numerics.QuantizedWeight is in."""
    return _FORMATS[q.format]


def choices() -> dict[str, tuple[int, str]]:
    """What a budget may choose among: choice name -> (bits, format name), in registration order."""
    return {choice: (bits, f.name) for f in _FORMATS.values() for choice, bits in f.choices.items()}


def default_choices() -> tuple[str, ...]:
    return tuple(choice for f in _FORMATS.values() if f.default_choice for choice in f.choices)


def all_bits() -> tuple[int, ...]:
    """Every code width some format takes, ascending."""
    return tuple(sorted({b for f in _FORMATS.values() for b in f.bits}))


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Formats registered inside the block are removed when it ends (for tests)."""
    before = dict(_FORMATS)
    try:
        yield
    finally:
        _FORMATS.clear()
        _FORMATS.update(before)


def _either(items) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]

