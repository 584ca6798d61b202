"""What each export target's engine runs, on the CPU: the facts the lowerings choose forms by.

`dyndq.export(model, target=...)` gives each engine only forms it runs, with our kernel's bits.
ONNX's DequantizeLinear-28 takes every code type, but no engine runs every form; measured on
ONNX Runtime 1.32 and OpenVINO 2026.4 (docs/engines.md holds the table a test generates):

- "onnx" (onnx.reference, and any engine that runs all of standard ONNX): every type.
- "onnxruntime": DequantizeLinear runs integer and float8 codes; float4e2m1 and float6 codes
  have neither DequantizeLinear nor Cast (float6 is not even a type it loads), float8e8m0
  scales no DequantizeLinear, but a Cast to float32 (exact).  The newest opset it loads is 26,
  the newest IR 13.
- "openvino": DequantizeLinear runs float4e2m1 codes and float8e8m0 scales but refuses int2,
  uint2 and float6 (as types) and a blocked DequantizeLinear of rank 1.

Where an engine lacks a type, a constant of that type is re-encoded as its bit patterns in an
unsigned type the engine has (float4e2m1 in uint4, float6 in uint8, int2/uint2 as their values
in int8/uint8) and decoded by a Gather from a table of the 2**bits values (exact: every code's
value is a float32); a value of that type computed at run time cannot be, and export names it.
"""
from __future__ import annotations

from dataclasses import dataclass

from dyndq.opdefs import FLOAT_CODES_3, INTEGER_CODES_3

__all__ = ["Engine", "ENGINES", "engine"]

_INTEGERS = frozenset(INTEGER_CODES_3)
_FLOAT8 = frozenset(("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"))
_FLOAT6 = frozenset(("float6_e2m3fn", "float6_e3m2fn"))
_EVERY_CODE = frozenset(INTEGER_CODES_3 + FLOAT_CODES_3)


@dataclass(frozen=True)
class Engine:
    """One export target's engine, as the lowerings see it."""

    name: str  # the export target
    title: str  # what a message calls it
    dql_codes: frozenset  # code dtypes its DequantizeLinear runs
    dql_e8m0_scales: bool  # whether its DequantizeLinear takes float8e8m0 scales
    lacks: frozenset = frozenset()  # dtypes it has no tensors of (nor Casts from)
    rank1_blocked: bool = True  # whether it runs a blocked DequantizeLinear on a rank-1 x

    def holds(self, dtype: str | None) -> bool:
        """Whether it has tensors of this dtype (an unknown dtype: assumed so)."""
        return dtype not in self.lacks


ENGINES = {
    e.name: e
    for e in (
        Engine("onnx", "standard ONNX", _EVERY_CODE, True),
        Engine("onnxruntime", "ONNX Runtime", _INTEGERS | _FLOAT8, False, lacks=frozenset({"float4_e2m1fn"}) | _FLOAT6),
        Engine("openvino", "OpenVINO", (_EVERY_CODE - _FLOAT6) - {"int2", "uint2"}, True,
               lacks=frozenset({"int2", "uint2"}) | _FLOAT6, rank1_blocked=False),
    )
}


def engine(target: str) -> Engine:
    """The engine of an export target ("onnx" for anything else: every form standard ONNX has)."""
    return ENGINES.get(target, ENGINES["onnx"])
