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
from dyndq.quantization import formats, plan as planning
from dyndq.quantization.formats.integer import DEFAULT_GROUP  # (integer codes' group size when none is given)
from dyndq.quantization.numerics import DATA_AWARE, METHODS

SCALE_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_FORMAT = "int"
FORMATS = formats.names()  # the formats registered when dyndq is imported (formats/: one module each)


def methods_of(format: str | None) -> tuple[str, ...]:
    """The methods a format takes (None: the default format): every one for integer codes; an FP4
    format's rule is its only method."""
    try:
        return formats.methods_of(formats.get(format or DEFAULT_FORMAT))
    except (KeyError, TypeError):  # (a format none registered: QuantizeOptions.checked names it)
        return ("rtn",)


class OptionError(ValidationError):
    """Options `quantize` cannot work with (a group size of 0, an op it does not quantize, a
    name the model does not hold): a mistake in the call, not in the model (the CLI: exit 2)."""


@dataclass(frozen=True)
class QuantizeOptions:
    """How to quantize a model (see `dyndq.quantize` for each)."""

    bits: int = 4
    group_size: int = DEFAULT_GROUP  # -1: one group per whole axis (per channel)
    format: str = DEFAULT_FORMAT
    symmetric: bool = False
    scale_dtype: str | None = None  # None: each weight's own dtype
    ops: tuple[str, ...] = planning.OPS
    exclude: tuple[str, ...] = ()  # node or weight names
    method: str = "rtn"
    seed: int = 0  # of the random inputs the output error is measured on
    budget: float | None = None  # bits per weight: mixed widths chosen among format_choices (budget.py)
    format_choices: tuple[str, ...] = ()  # (with a budget) int2, int4, int8, mxfp4, nvfp4 (formats.choices())
    # (method "gptq", gptq.py) its damping (times the mean of the Hessian's diagonal), lazy block and column order
    damping: float = 0.01
    block_size: int = 128
    act_order: bool = False
    # (a data-aware method, calibration.py) bytes of layer statistics held at once; None: the default bound
    calibration_memory: int | None = None
    scale_estimation: bool = False  # each group's scale refitted to the output error on the calibration data

    @property
    def data_aware(self) -> bool:
        """Whether the method needs calibration inputs (gptq, awq, or any with scale estimation): the
        quantizer collects the layers' inputs."""
        return self.method in DATA_AWARE or self.scale_estimation

    @property
    def gptq(self):
        """gptq.GptqSettings of these options."""
        from dyndq.quantization.gptq import GptqSettings

        return GptqSettings(self.damping, self.block_size, self.act_order)

    @property
    def fmt(self) -> formats.Format:
        """The format (formats/), which quantizes each weight and writes its nodes."""
        return formats.get(self.format)

    @classmethod
    def checked(cls, model, *, bits=None, group_size=None, symmetric=False, scale_dtype=None, ops=planning.OPS,
                exclude=(), method="rtn", seed=0, format=None, budget=None,
                format_choices=None, damping=None, block_size=None, act_order=None,
                calibration_memory=None,
                scale_estimation=False) -> QuantizeOptions:
        """The options for `model` (whose node and weight names `exclude` must name), or
        OptionError naming every bad one.  bits and format None: not given (4 and "int"; with a
        budget, which chooses them, neither may be given, whatever its value).  damping, block_size
        and act_order: method "gptq"'s (None: not given, its defaults; given with another method, a
        mistake).  calibration_memory: a data-aware method's bound on the layer statistics held at once,
        bytes (a whole number) or a size ("512MiB", "2GB"); None: calibration.py's default."""
        problems = []
        given = {name: value for name, value in (("bits", bits), ("format", format)) if value is not None}
        format = DEFAULT_FORMAT if format is None else format
        fmt = formats.get(format) if isinstance(format, str) and format in formats.names() else None
        bits = (fmt.bits[0] if fmt is not None else formats.get(DEFAULT_FORMAT).bits[0]) if bits is None else bits
        original = dict(ops=ops, exclude=exclude)

        def bad(argument, found, allowed):
            problems.append(Problem(argument, found, allowed))

        every_bits = formats.all_bits()
        if isinstance(bits, bool) or bits not in every_bits:
            bad("bits", repr(bits), ", ".join(map(str, every_bits[:-1])) + f" or {every_bits[-1]}")
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or
                                       not (group_size >= 1 or group_size == -1)):
            bad("group_size", repr(group_size), "a whole number >= 1, or -1 for one group per whole axis (per channel)")
        if fmt is None:
            bad("format", repr(format), ", ".join(formats.names()))
        else:  # (what the format fixes, its block, scales and rounding: what differs is a mistake)
            problems += fmt.problems(bits=bits, group_size=group_size, scale_dtype=scale_dtype, method=method)
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
        gptq_given = {name: value for name, value in (("damping", damping), ("block_size", block_size),
                                                       ("act_order", act_order)) if value is not None}
        if method != "gptq":
            for name, value in gptq_given.items():
                bad(name, f"{value!r} with method {method!r}", "only with method 'gptq' (or none given)")
        memory = None
        if calibration_memory is not None:
            memory = byte_size(calibration_memory)
            if memory is None:
                bad("calibration_memory", repr(calibration_memory),
                    "a number of bytes >= 1, as a whole number or a size such as '512MiB' or '2GB'")
            elif method not in DATA_AWARE and scale_estimation is not True:
                bad("calibration_memory", f"{calibration_memory!r} with method {method!r}",
                    f"only with a data-aware method ({', '.join(DATA_AWARE)}) or scale_estimation")
        if damping is not None and (isinstance(damping, bool) or not isinstance(damping, numbers.Real)
                                    or not 0 < damping < float("inf")):
            bad("damping", repr(damping), "a number > 0 (times the mean of the Hessian's diagonal; default 0.01)")
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral)
                                       or block_size < 1):
            bad("block_size", repr(block_size), "a whole number >= 1 (columns per lazy batch; default 128)")
        if act_order is not None and not isinstance(act_order, (bool, np.bool_)):
            bad("act_order", repr(act_order), "True or False")
        if not isinstance(scale_estimation, (bool, np.bool_)):
            bad("scale_estimation", repr(scale_estimation), "True or False")
        elif scale_estimation:  # (scale_estimation.py: integer codes' free scales and zero points only)
            if fmt is not None and fmt.name != DEFAULT_FORMAT:
                bad("scale_estimation", f"True with format {format!r}", "integer codes (format 'int'): an FP4 "
                    "format's scales are not free (MXFP4's a shared power of two, NVFP4's E4M3 with a tensor scale)")
        ops = _names(ops)
        if ops is None:
            bad("ops", repr(original["ops"]), "an op name or a sequence of them: " + ", ".join(planning.OPS))
            ops = planning.OPS
        for op in ops:
            if op not in planning.OPS:
                bad("ops", repr(op), ", ".join(planning.OPS))
        if not ops:
            bad("ops", "no op", "one or more of " + ", ".join(planning.OPS))
        exclude = _names(exclude)
        if exclude is None:
            bad("exclude", repr(original["exclude"]), "a node or weight name, or a sequence of them")
            exclude = ()
        nodes, weights = planning.names_of(model)
        for x in exclude:
            if x not in nodes and x not in weights:
                bad("exclude", repr(x), "the name of a node or a weight (initializer) of the model")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            bad("seed", repr(seed), "a whole number >= 0")
        choices = ()
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, numbers.Real) or not budget > 0:
                bad("budget", repr(budget), "a number of bits per weight > 0 (e.g. 4.2)")
            for name, value in given.items():  # (4 or "int" given too: a budget never reads them)
                bad(name, f"{value!r} with a budget", "none given: the budget chooses each weight's format among "
                                                      "format_choices")
            choices, wrong = parse_choices(formats.default_choices() if format_choices is None else format_choices)
            problems += wrong
        elif format_choices is not None:
            bad("format_choices", repr(format_choices), "none without a budget (it names what a budget chooses among)")
        if problems:
            raise OptionError(problems)
        group_size = fmt.group_size(group_size)
        return cls(bits=int(bits), group_size=int(group_size), symmetric=bool(symmetric), scale_dtype=name, ops=ops,
                   exclude=exclude, method=method, seed=int(seed), format=format,
                   budget=None if budget is None else float(budget), format_choices=choices,
                   damping=0.01 if damping is None else float(damping),
                   block_size=128 if block_size is None else int(block_size),
                   act_order=bool(act_order), calibration_memory=memory,
                   scale_estimation=bool(scale_estimation))

    def settings(self) -> dict:
        """The options that shape the quantized model, as the report writes them (the seed, which
        only the output error uses, left out)."""
        return dict(format=self.format, bits=self.bits, group_size=self.group_size, symmetric=self.symmetric,
                    scale_dtype=self.scale_dtype, ops=list(self.ops), exclude=list(self.exclude), method=self.method,
                    **({} if self.budget is None else dict(budget=self.budget, format_choices=list(self.format_choices))),
                    **(dict(damping=self.damping, block_size=self.block_size, act_order=self.act_order)
                       if self.method == "gptq" else {}),
                    **(dict(scale_estimation=True) if self.scale_estimation else {}))


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(value) -> int | None:
    """A number of bytes >= 1: a whole number, or a string of a number and a unit of _UNITS
    ("512MiB", "1.5 GB", "4096"); None for anything else."""
    import re

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value) if value >= 1 else None
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", value)
    if m is None or m.group(2).lower() not in _UNITS:
        return None
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    return n if n >= 1 else None


def _names(value) -> tuple | None:
    """A name, or a sequence of them, as a tuple; None for anything else (a number, None)."""
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        return None


def parse_choices(choices) -> tuple[tuple[str, ...], list[Problem]]:
    """A budget's choices as a tuple of names (from a comma-separated string or a sequence), and problems."""
    items = [c.strip() for c in choices.split(",")] if isinstance(choices, str) else list(_names(choices) or [choices])
    every = formats.choices()
    if not items or any(not isinstance(c, str) or c not in every for c in items):
        return tuple(items), [Problem("format_choices", repr(",".join(map(str, items))),
                                      "one or more of " + ", ".join(every) + ", comma separated")]
    return tuple(dict.fromkeys(items)), []
