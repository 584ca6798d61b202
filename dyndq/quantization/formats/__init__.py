"""The quantization formats: one module each, registered as a contrib op's converter is.

A format is an object of a `Format` subclass (registry.py), registered with `register` by its module
(`integer.py`: int2/int4/int8; `mxfp4.py`; `nvfp4.py`; the last two share `float4.py`), and holds
what makes it one:

- its option checks: the data it declares (`bits`, `block`, `methods`, whether it takes
  `scale_dtype`) judged by `Format.problems`, which `options.QuantizeOptions.checked` calls, and
  `fits` (the weights at hand: the integer codes' group no longer than the longest axis);
- its quantize: `quantize(weight, target, options, bits)`, one weight as a
  `numerics.QuantizedWeight` (its `format` the format's name);
- its dequantize for the budget: `dequantize(q, dtype)`, the weight the graph gives back, by
  our kernel (budget.py feeds it to the model where it measures a choice);
- the nodes it writes: `nodes(name, dtype, q, names, opset)`, the tensors and nodes standing
  for the weight (rewrite.py's `placed`, which the format's hooks `form` and `scale_inputs`
  shape), and the words the report says it in (`describe`);
- the choices a budget may make of it (`choices`: "int2" -> 2 bits, ...).

Nothing else names a format: options.py, the quantizer, budget.py and rewrite.py ask the
registry (`get`, `of`, `names`, `choices`).  Adding one is a module here and its import at
the end of this file (docs/house.md, "Adding a quantization format"); a test registers one
of its own inside `scope()`.
"""
from dyndq.quantization.formats.registry import (Format, all_bits, choices, default_choices, get, methods_of, names, of,
                                                 register, scope)
from dyndq.quantization.formats import integer, mxfp4, nvfp4  # noqa: E402,F401  (each registers its format: the registration)

__all__ = ["Format", "all_bits", "choices", "default_choices", "get", "integer", "methods_of", "mxfp4", "names", "nvfp4", "of",
           "register", "scope"]
