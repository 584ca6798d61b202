"""The engine table: one row per engine an export is for (its export target), holding what it runs
on the CPU (the facts the lowerings choose forms by), which of dyndq's runners runs it, and what a
file written for it is checked on.  Every list of engines derives from it: export's targets
(`rules.TARGETS`, `dyndq export --target`), quantize's `--emit` forms, the forms a written file is
checked as (`dyndq.written`), the engines `check --runtime-parity` compares and `dyndq.run` runs,
and the tests' runners (tests/engines.py): a new engine is a row here and its runner
(`dyndq/<engine>_session.py`, named in `dyndq.runner.SESSIONS`).

`dyndq.export(model, target=...)` gives each engine only forms it runs, with our kernel's bits.
ONNX's DequantizeLinear-28 takes every code type, but no engine runs every form; measured on
ONNX Runtime 1.32 and OpenVINO 2026.4 (docs/engines.md holds the table a test generates):

- "onnx" (onnx.reference, and any engine that runs all of standard ONNX): every type; its
  DequantizeLinear leaves float8 and float4 zero points out (a -0 code minus -0 stays -0).
- "onnxruntime": DequantizeLinear runs integer and float8 codes; float4e2m1 and float6 codes
  have neither DequantizeLinear nor Cast (float6 is not even a type it loads), float8e8m0
  scales no DequantizeLinear, but a Cast to float32 (exact).  The newest opset it loads is 26,
  the newest IR 13.  It refuses a -0 float8 zero point, its graph optimizer deletes a Sub of a
  constant zero (-0 included), and its blocked DequantizeLinear gives a NaN scale's NaN beside a
  NaN code (the kernel the code's).
- "openvino": DequantizeLinear runs float4e2m1 codes and float8e8m0 scales but refuses int2,
  uint2, float6 and the float8 fnuz types (as types: its ONNX reader has none of them) and a
  blocked DequantizeLinear of rank 1.

OpenVINO's CPU plugin cannot give the kernel's bits everywhere (`Engine.deviations`, measured by
`tests/test_engine_table.py`): it folds constant subgraphs with arithmetic of its own (float32 to
bfloat16 truncated, subnormals flushed).

Where an engine lacks a type, a constant of that type is re-encoded as its bit patterns in an
unsigned type the engine has (float4e2m1 in uint4, float6 in uint8, int2/uint2 as their values
in int8/uint8) and decoded by a Gather from a table of the 2**bits values (exact: every code's
value is a float32); a value of that type computed at run time cannot be, and export names it.
"""
from __future__ import annotations

from dataclasses import dataclass

from dyndq.opdefs import FLOAT_CODES_3, INTEGER_CODES_3

__all__ = ["Engine", "ENGINES", "engine", "compared"]

_INTEGERS = frozenset(INTEGER_CODES_3)
_FLOAT8 = frozenset(("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"))
_FLOAT6 = frozenset(("float6_e2m3fn", "float6_e3m2fn"))
_FNUZ = frozenset(("float8_e4m3fnuz", "float8_e5m2fnuz"))
_EVERY_CODE = frozenset(INTEGER_CODES_3 + FLOAT_CODES_3)


@dataclass(frozen=True)
class Engine:
    """One export target's engine, as the lowerings see it."""

    name: str  # the export target
    title: str  # what a message calls it
    writes: str  # what export writes for it, in a few words (the CLI's help of --target and --emit)
    # dyndq's runner of the engine ("reference": onnx.reference with our kernel, every standard form)
    runner: str
    # the runners a file written for it is loaded on (dyndq.written) and `check --runtime-parity` runs
    # its export on: the first; the next where the first has no kernel for an op of it
    loads_on: tuple
    dql_codes: frozenset  # code dtypes its DequantizeLinear runs
    dql_e8m0_scales: bool  # whether its DequantizeLinear takes float8e8m0 scales
    lacks: frozenset = frozenset()  # dtypes it has no tensors of (nor Casts from)
    rank1_blocked: bool = True  # whether it runs a blocked DequantizeLinear on a rank-1 x
    # whether its DequantizeLinear takes a blocked x whose last block is short (OpenVINO's ONNX
    # reader checks x.shape[axis] % block_size == 0)
    short_last_block: bool = True
    # whether its Mul of two NaNs of one shape gives the second's (ONNX Runtime: then Mul(scales,
    # codes) keeps the codes' NaN, as the kernel does; where one operand is broadcast it gives the
    # other's, whatever the order)
    nan_of_second: bool = False
    # whether its DequantizeLinear with a zero point gives the exact difference (OpenVINO fuses the
    # float32 Sub and Mul into one multiply-add: the integer route instead, which it computes exactly)
    dql_zero_points: bool = True
    # the float code types whose DequantizeLinear subtracts a -0 zero point as the standard's
    # (x - x_zero_point) * x_scale does (a -0 code gives +0): onnx.reference subtracts for float6 but
    # leaves float8 and float4 zero points out, ONNX Runtime refuses a -0 float8 one.  Other zero
    # points holding a -0 (or computed at run time) take the decode route, which subtracts them itself.
    dql_float_zero_points: frozenset = frozenset()
    # whether its blocked DequantizeLinear gives the scale's NaN where a code and its scale are both
    # NaN (ONNX Runtime; per tensor and per axis, the code's, as the kernel does): IEEE 754 leaves the
    # choice open, and the export takes the codes' NaN back (Where(IsNaN(codes), codes, y))
    blocked_nan_of_scale: bool = False
    deviations: tuple = ()  # where it cannot give the kernel's bits, measured, in a few words

    def holds(self, dtype: str | None) -> bool:
        """Whether it has tensors of this dtype (an unknown dtype: assumed so)."""
        return dtype not in self.lacks


ENGINES = {
    e.name: e
    for e in (
        Engine("onnx", "standard ONNX",
               "standard ONNX only (ONNX Runtime's MatMulNBits/GatherBlockQuantized become DequantizeLinear + "
               "MatMul/Gather; DequantizeLinear at the opset its types need)",
               "reference", ("onnxruntime", "reference"), _EVERY_CODE, True, dql_float_zero_points=_FLOAT6),
        Engine("onnxruntime", "ONNX Runtime",
               "ONNX Runtime's contrib ops (MatMulNBits, GatherBlockQuantized) where they express a DynamicDequantize "
               "on constant weights exactly, and forms ONNX Runtime's CPU runs for the rest (float4/float6 codes "
               "decoded by a table)",
               "onnxruntime", ("onnxruntime",), _INTEGERS | _FLOAT8, False,
               lacks=frozenset({"float4_e2m1fn"}) | _FLOAT6, nan_of_second=True, blocked_nan_of_scale=True),
        Engine("openvino", "OpenVINO",
               "standard forms OpenVINO's CPU runs (int2 and float6 decoded by a table, no rank-1 blocked "
               "DequantizeLinear)",
               "openvino", ("openvino",), _EVERY_CODE - _FLOAT6 - _FNUZ - {"int2", "uint2"}, True,
               lacks=frozenset({"int2", "uint2"}) | _FLOAT6 | _FNUZ, rank1_blocked=False, dql_zero_points=False,
               short_last_block=False,
               deviations=("a bfloat16 output: its constant folding truncates float32 to bfloat16",
                           "subnormal constants and results: flushed to zero, and -0 constants made +0",
                           "NaN codes: their own payload (float8e5m2's)",
                           "int32 zero points far from the codes: it computes int64 in int32")),
    )
}


def engine(target: str) -> Engine:
    """The engine of an export target ("onnx" for anything else: every form standard ONNX has)."""
    return ENGINES.get(target, ENGINES["onnx"])


def compared() -> dict[str, tuple[str, ...]]:
    """runner -> the export targets whose files it loads first, for each runner that loads some
    (`check --runtime-parity` compares each: {"onnxruntime": ("onnx", "onnxruntime"),
    "openvino": ("openvino",)})."""
    out: dict[str, tuple[str, ...]] = {}
    for e in ENGINES.values():
        out[e.loads_on[0]] = out.get(e.loads_on[0], ()) + (e.name,)
    return out
