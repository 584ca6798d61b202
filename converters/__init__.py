"""Conversions between forms of the op: lowering to standard ONNX, lifting from it, and the
forms other engines define, each one rule in one registry (`rules`).

Importing this package attaches each op's lowering, its needs and its lifting to the op's
handle in `opdefs` (`dynamic_dequantize`: versions 1 and 2; `dynamic_dequantize_3`) and registers
every rule: the rules of
`dynamic_dequantize` (a blocked DequantizeLinear with a short last block, both ways), those
of ONNX Runtime's contrib ops (`contrib/`, one module per op), and those applying the op
versions' own parts (`op_parts`), in that order: a node is offered to the rules in the order
they were registered.  `rewrite` is what every rule works with, `walker` applies rewrites to
a model, `lowering_context` is what every lowering gets, `engines` what each export target's
engine runs.
"""
from . import dynamic_dequantize, dynamic_dequantize_3, engines, lowering_context, rewrite, rules, walker
from .contrib import gather_block_quantized, matmul_nbits  # (their order: contrib/__init__.py)
from . import op_parts

__all__ = ["dynamic_dequantize", "dynamic_dequantize_3", "engines", "gather_block_quantized", "lowering_context", "matmul_nbits", "op_parts", "rewrite",
           "rules", "walker"]
