"""One table of cases, shared by every check: shape inference, dyndq.check, the
kernel and export all run the same rows, so a rule cannot hold in one layer and
be forgotten in another.

A row describes one use of one op version (`op`, DynamicDequantize-1 unless it
says otherwise): the dtypes and shapes of its inputs, its attributes, and
either None (valid) or the argument names that the problems must name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

import dyndq
import dyndq.plumbing.ir
from dyndq.plumbing.types import elem_type, make_attribute
from dyndq.opdefs import dtypes


@dataclass(frozen=True)
class Case:
    id: str
    src: tuple[str, tuple]  # (dtype, shape)
    scales: tuple[str, tuple]
    zps: tuple[str, tuple] | None = None
    attrs: dict = field(default_factory=dict)
    bad: frozenset[str] | None = None  # arguments the problems must name; None = valid
    version: int = 1  # the version of org.dyndq the row is judged by (and its model imports)
    dst: str | None = None  # the dst dtype the model declares, when not the one the op gives

    @property
    def op(self):
        return dyndq.opdefs.resolve(dyndq.DOMAIN, "DynamicDequantize", self.version)

    @property
    def valid(self) -> bool:
        return self.bad is None

    @property
    def dst_dtype(self) -> str:
        """The dtype the op gives dst: output_dtype's, else the scales' (float32 where neither is one)."""
        if self.attrs.get("output_dtype") in (1, 10, 16):
            return dtypes.by_onnx(self.attrs["output_dtype"]).name
        return self.scales[0] if self.scales[0] in ("float32", "float16", "bfloat16") else "float32"

    def arrays(self, seed: int = 0):
        """Random arrays of the row's dtypes and shapes (values in each dtype's full range)."""
        rng = np.random.default_rng(seed)
        src = _random(rng, *self.src)
        scales = _random(rng, *self.scales)
        zps = None if self.zps is None else _random(rng, *self.zps)
        if zps is not None and self.zps[0] in dyndq.opdefs.FLOAT_CODES_3:  # float codes' zero points are 0:
            negative = rng.random(zps.shape) < 0.5  # +0 and -0 (a -0 code minus -0 is +0)
            zps = np.where(negative, np.float32(-0.0), np.float32(0.0)).astype(zps.dtype)
        return src, scales, zps


def _random(rng, dtype, shape) -> np.ndarray:
    """Always an ndarray: NumPy gives scalars for shape (), which ONNX Runtime refuses as feeds."""
    return np.asarray(_draw(rng, dtype, shape))


# version 3's float codes and float8e8m0 scales: every bit pattern drawn (NaN, infinities and
# subnormals included), where the older rows draw small normal values
_ANY_PATTERN = frozenset(dyndq.opdefs.FLOAT_CODES_3) | {"float8_e8m0fnu"}


def _draw(rng, dtype, shape):
    dt = dtypes.by_name(dtype) if isinstance(dtype, str) else dtypes.of(dtype)
    if dt.name in _ANY_PATTERN:
        return rng.integers(0, 1 << dt.bits, size=shape).astype(np.uint8).view(dt.numpy)
    if dt.name == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.is_integer:
        info = dtypes.integer_range(dt)
        return rng.integers(info[0], info[1], size=shape, endpoint=True).astype(dt.numpy)
    if dt.is_float:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32).astype(dt.numpy)
    raise ValueError(dtype)


def bad(*args: str) -> frozenset[str]:
    return frozenset(args)


PT = {"qtype": "per_tensor"}


def PC(axis):
    return {"qtype": "per_channel", "axis": axis}


CASES = [
    # -- valid: every T1 x T3 pair, per tensor ------------------------------------
    *[
        Case(f"pt-{s}-{z or 'nozp'}", (s, (2, 3, 4)), ("float32", (1,)), None if z is None else (z, (1,)), PT)
        for s in ("int8", "uint8")
        for z in (None, "int8", "uint8", "int32")
    ],
    Case("pt-scalar-scale-and-zp", ("uint8", (5,)), ("float32", ()), ("uint8", ()), PT),
    Case("pt-rank0-src", ("int8", ()), ("float32", (1,)), ("int8", (1,)), PT),
    Case("pt-default-attrs", ("uint8", (4, 4)), ("float32", (1,)), ("int32", (1,)), {}),
    Case("pt-empty", ("int8", (0, 3)), ("float32", (1,)), ("int8", (1,)), PT),
    Case("pt-axis-ignored", ("int8", (2, 3)), ("float32", (1,)), None, {"qtype": "per_tensor", "axis": 7}),
    # -- valid: per channel ---------------------------------------------------------
    *[
        Case(f"pc-{s}-{z or 'nozp'}-axis{a}", (s, (2, 3, 4)), ("float32", ((2, 3, 4)[a],)),
             None if z is None else (z, ((2, 3, 4)[a],)), PC(a))
        for s in ("int8", "uint8")
        for z in (None, "int8", "uint8", "int32")
        for a in (0, 1, 2, -1, -3)
    ],
    Case("pc-one-zp-broadcast", ("int8", (2, 8)), ("float32", (8,)), ("int8", (1,)), PC(1)),
    Case("pc-scalar-zp-broadcast", ("uint8", (2, 8)), ("float32", (8,)), ("int32", ()), PC(-1)),
    Case("pc-empty-other-dim", ("uint8", (0, 3)), ("float32", (3,)), ("uint8", (3,)), PC(1)),
    Case("pc-empty-channel-dim", ("uint8", (4, 0)), ("float32", (0,)), ("uint8", (0,)), PC(1)),
    Case("pc-rank1", ("int8", (6,)), ("float32", (6,)), ("int32", (6,)), PC(0)),
    Case("onednn-conv-weights", ("int8", (2, 64, 3, 3)), ("float32", (64,)), None, PC(1)),
    # -- type constraints -------------------------------------------------------------
    *[
        Case(f"bad-src-{d}", (d, (2, 3)), ("float32", (1,)), None, PT, bad("src"))
        for d in ("float16", "float32", "int16", "int32", "bool")
    ],
    *[
        Case(f"bad-scales-{d}", ("int8", (2, 3)), (d, (1,)), None, PT, bad("scales"))
        for d in ("float16", "float64")
    ],
    *[
        Case(f"bad-zps-{d}", ("int8", (2, 3)), ("float32", (1,)), (d, (1,)), PT, bad("zps"))
        for d in ("float32", "uint16", "int64")
    ],
    # -- shapes --------------------------------------------------------------------------
    Case("pt-scales-too-long", ("int8", (2, 3)), ("float32", (3,)), None, PT, bad("scales")),
    Case("pt-scales-rank2", ("int8", (2, 3)), ("float32", (1, 1)), None, PT, bad("scales")),
    Case("pt-zps-too-long", ("int8", (2, 3)), ("float32", (1,)), ("int8", (2,)), PT, bad("zps")),
    Case("pc-scales-wrong-length", ("int8", (2, 3)), ("float32", (2,)), None, PC(1), bad("scales")),
    Case("pc-scales-rank0", ("int8", (2, 3)), ("float32", ()), None, PC(1), bad("scales")),
    Case("pc-scales-rank2", ("int8", (2, 3)), ("float32", (1, 3)), None, PC(1), bad("scales")),
    Case("pc-zps-unlike-scales", ("int8", (2, 3)), ("float32", (3,)), ("int8", (2,)), PC(1), bad("zps")),
    Case("pc-zps-rank2", ("int8", (2, 3)), ("float32", (3,)), ("int8", (1, 3)), PC(1), bad("zps")),
    Case("pc-axis-too-big", ("int8", (2, 3)), ("float32", (3,)), None, PC(2), bad("axis")),
    Case("pc-axis-too-small", ("int8", (2, 3)), ("float32", (3,)), None, PC(-3), bad("axis")),
    Case("pc-rank0-src", ("int8", ()), ("float32", (1,)), None, PC(0), bad("src")),
    Case("unknown-qtype", ("int8", (2, 3)), ("float32", (1,)), None, {"qtype": "per_group"}, bad("qtype")),
    Case("several-at-once", ("int16", (2, 3)), ("float64", (5,)), ("int64", (4,)), PC(1), bad("src", "scales", "zps")),
]

VALID = [c for c in CASES if c.valid]
INVALID = [c for c in CASES if not c.valid]


# -- DynamicDequantize-2 ----------------------------------------------------------------------------


def PG(*groups):
    return {"qtype": "per_group", "group_shape": list(groups)}


_SRC_2 = ("int8", "uint8", "int4", "uint4")
_ZPS_2 = (None, "int8", "uint8", "int32", "int4", "uint4")
_T2 = ("float32", "float16", "bfloat16")


def _pg(src_shape, groups):
    return tuple(d // g for d, g in zip(src_shape, groups))


CASES_2 = [
    # -- every version-1 row means the same under version 2 -----------------------------------------
    *[dataclasses.replace(c, id=f"v1-{c.id}", version=2) for c in VALID],
    # -- every T1 x T3 pair, with each T2 in turn ------------------------------------------------------
    *[
        Case(f"v2-pt-{s}-{z or 'nozp'}-{t}", (s, (2, 3, 4)), (t, (1,)), None if z is None else (z, (1,)), PT,
             version=2)
        for s in _SRC_2 for z in _ZPS_2 for t in _T2
    ],
    *[
        Case(f"v2-pc-{s}-{z or 'nozp'}-{t}-axis{a}", (s, (2, 3, 4)), (t, ((2, 3, 4)[a],)),
             None if z is None else (z, ((2, 3, 4)[a],)), PC(a), version=2)
        for s in _SRC_2 for z in _ZPS_2 for t in _T2 for a in (0, -1)
    ],
    Case("v2-pc-int4-one-zp", ("int4", (4, 6)), ("float16", (6,)), ("int4", (1,)), PC(1), version=2),
    Case("v2-pc-uint4-scalar-zp-int32", ("uint4", (4, 6)), ("bfloat16", (6,)), ("int32", ()), PC(-1), version=2),
    # -- per_group: one grouped dim on every axis, several at once, ranks 1 to 5, zero-size dims ---------
    *[
        Case(f"v2-pg-{s}-{z or 'nozp'}-{t}-last", (s, (4, 64)), (t, (4, 2)), None if z is None else (z, (4, 2)),
             PG(1, 32), version=2)
        for s in _SRC_2 for z in _ZPS_2 for t in _T2
    ],
    *[
        Case(f"v2-pg-uint4-uint8-float16-axis{a}-rank{len(shape)}", ("uint4", shape), ("float16", _pg(shape, g)),
             ("uint8", _pg(shape, g)), PG(*g), version=2)
        for shape in ((8,), (8, 6), (2, 8, 6), (2, 3, 8, 4), (2, 1, 3, 8, 2))
        for a in range(len(shape))
        for g in [tuple(4 if i == a and shape[i] % 4 == 0 else (2 if i == a and shape[i] % 2 == 0 else 1)
                        for i in range(len(shape)))]
    ],
    Case("v2-pg-two-dims", ("int4", (8, 64)), ("float32", (2, 2)), ("int4", (2, 2)), PG(4, 32), version=2),
    Case("v2-pg-three-dims", ("uint8", (4, 6, 8)), ("bfloat16", (2, 3, 2)), ("int32", (2, 3, 2)), PG(2, 2, 4),
         version=2),
    Case("v2-pg-all-ones", ("int8", (3, 5)), ("float16", (3, 5)), ("int8", (3, 5)), PG(1, 1), version=2),
    Case("v2-pg-whole-tensor", ("uint4", (4, 8)), ("float32", (1, 1)), None, PG(4, 8), version=2),
    Case("v2-pg-empty-dim", ("int4", (0, 64)), ("float16", (0, 2)), ("int4", (0, 2)), PG(1, 32), version=2),
    Case("v2-pg-axis-ignored", ("uint4", (4, 64)), ("float16", (4, 2)), None, {**PG(1, 32), "axis": 9}, version=2),
    Case("v2-pc-group-shape-ignored", ("int4", (4, 6)), ("float16", (6,)), None, {**PC(1), "group_shape": [7]},
         version=2),
    Case("onednn-gated-mlp-weights", ("uint4", (256, 64)), ("float16", (2, 64)), ("uint8", (2, 64)), PG(128, 1),
         version=2),
    # -- forms of the converter's routes: a one-element zero point, 4-bit zero points under 8-bit src,
    # groups along axis 0, one scale for the whole tensor, a parameter per element ----------------------
    Case("v2-pt-int4-int4-f32", ("int4", (3, 4)), ("float32", (1,)), ("int4", (1,)), PT, version=2),
    Case("v2-pt-uint4-scalar-f16", ("uint4", (5,)), ("float16", ()), ("uint4", ()), PT, version=2),
    Case("v2-pt-int8-int32-bf16", ("int8", (2, 3)), ("bfloat16", (1,)), ("int32", (1,)), PT, version=2),
    Case("v2-pc-uint4-uint4-f16", ("uint4", (2, 6)), ("float16", (6,)), ("uint4", (6,)), PC(1), version=2),
    Case("v2-pc-int4-one-zp-bf16", ("int4", (4, 3)), ("bfloat16", (4,)), ("int4", (1,)), PC(0), version=2),
    Case("v2-pc-uint8-int4-f32", ("uint8", (2, 3, 4)), ("float32", (3,)), ("int4", (3,)), PC(-2), version=2),
    Case("v2-pg-uint4-uint4-f32", ("uint4", (4, 64)), ("float32", (4, 2)), ("uint4", (4, 2)), PG(1, 32), version=2),
    Case("v2-pg-uint4-uint8-f16", ("uint4", (64, 16)), ("float16", (2, 16)), ("uint8", (2, 16)), PG(32, 1),
         version=2),
    Case("v2-pg-int4-nozp-bf16", ("int4", (8, 4)), ("bfloat16", (2, 4)), None, PG(4, 1), version=2),
    Case("v2-pg-int8-2d-groups-f16", ("int8", (4, 6)), ("float16", (2, 3)), ("int8", (2, 3)), PG(2, 2), version=2),
    Case("v2-pg-one-scale", ("uint4", (2, 8)), ("float32", (1, 1)), ("uint4", (1, 1)), PG(2, 8), version=2),
    Case("v2-pg-per-element", ("int4", (3, 2)), ("float16", (3, 2)), ("int4", (3, 2)), PG(1, 1), version=2),
    Case("v2-pg-empty", ("uint8", (0, 4)), ("float32", (0, 2)), ("uint8", (0, 2)), PG(1, 2), version=2),
    # -- invalid forms --------------------------------------------------------------------------------
    Case("v2-pg-no-group-shape", ("uint4", (4, 64)), ("float16", (4, 2)), None, {"qtype": "per_group"},
         bad("group_shape"), version=2),
    Case("v2-pg-group-shape-too-short", ("uint4", (4, 64)), ("float16", (4, 2)), None, PG(32), bad("group_shape"),
         version=2),
    Case("v2-pg-group-shape-zero", ("uint4", (4, 64)), ("float16", (4, 2)), None, PG(0, 32), bad("group_shape"),
         version=2),
    Case("v2-pg-group-not-dividing", ("uint4", (4, 64)), ("float16", (4, 2)), None, PG(1, 30), bad("group_shape"),
         version=2),
    Case("v2-pg-scales-wrong-rank", ("uint4", (4, 64)), ("float16", (8,)), None, PG(1, 32), bad("scales"),
         version=2),
    Case("v2-pg-scales-wrong-dims", ("uint4", (4, 64)), ("float16", (4, 4)), None, PG(1, 32), bad("scales"),
         version=2),
    Case("v2-pg-zps-unlike-scales", ("uint4", (4, 64)), ("float16", (4, 2)), ("uint8", (1,)), PG(1, 32),
         bad("zps"), version=2),
    Case("v2-pg-rank0-src", ("int4", ()), ("float16", ()), None, PG(), bad("src"), version=2),
    *[
        Case(f"v2-bad-src-{d}", (d, (2, 3)), ("float32", (1,)), None, PT, bad("src"), version=2)
        for d in ("int16", "int32", "float16", "float8_e4m3fn", "int2", "bool")
    ],
    *[
        Case(f"v2-bad-scales-{d}", ("int4", (2, 3)), (d, (1,)), None, PT, bad("scales"), version=2)
        for d in ("float64", "float8_e4m3fn", "int8")
    ],
    *[
        Case(f"v2-bad-zps-{d}", ("uint4", (2, 3)), ("float16", (1,)), (d, (1,)), PT, bad("zps"), version=2)
        for d in ("int16", "int64", "float16", "uint2")
    ],
    Case("v2-dst-declared-float32", ("uint4", (2, 3)), ("float16", (1,)), None, PT, bad("dst"), version=2,
         dst="float32"),
    Case("v2-unknown-qtype", ("int8", (2, 3)), ("float32", (1,)), None, {"qtype": "per_block"}, bad("qtype"),
         version=2),
    Case("v2-several-at-once", ("int16", (4, 64)), ("float64", (4, 4)), ("int64", (4,)), PG(1, 30),
         bad("src", "scales", "zps", "group_shape"), version=2),
]
VALID_2 = [c for c in CASES_2 if c.valid]
INVALID_2 = [c for c in CASES_2 if not c.valid]


# -- DynamicDequantize-3 ----------------------------------------------------------------------------

_INT_3, _FLOAT_3 = dyndq.opdefs.INTEGER_CODES_3, dyndq.opdefs.FLOAT_CODES_3
_CODES_3 = _INT_3 + _FLOAT_3
_OUT = {"float32": 1, "float16": 10, "bfloat16": 16}
E8M0 = "float8_e8m0fnu"
# scales and the output dtype, in turn: float8e8m0 scales need output_dtype
_SCALE_TURNS = (("float16", None), ("bfloat16", None), (E8M0, "float32"), ("float32", "bfloat16"), (E8M0, "float16"))


def _out(attrs, out):
    return attrs if out is None else {**attrs, "output_dtype": _OUT[out]}


CASES_3 = [
    # -- version-2 rows mean the same under version 3 (a sample across their forms) --------------------
    *[dataclasses.replace(c, id=f"v3-{c.id}", version=3) for c in VALID_2[::12]],
    # -- every code type: per tensor, per channel and per group, with each scale and output dtype -------
    *[Case(f"v3-pt-{s}", (s, (3, 5)), ("float32", (1,)), None, PT, version=3) for s in _CODES_3],
    *[
        Case(f"v3-pc-{s}-{t}-{out or t}", (s, (4, 6)), (t, (4,)), None, _out(PC(0), out), version=3)
        for k, s in enumerate(_CODES_3) for t, out in [_SCALE_TURNS[k % len(_SCALE_TURNS)]]
    ],
    # every (code, scales, output) combination, per group
    *[
        Case(f"v3-pg-{s}-{t}-{out}", (s, (4, 64)), (t, (4, 2)), None,
             _out(PG(1, 32), None if out == t else out), version=3)
        for s in _CODES_3 for t in ("float32", "float16", "bfloat16", E8M0) for out in _OUT
    ],
    # MXFP4 (float4e2m1 codes, float8e8m0 scales per 32) in every output dtype; a blocked rank-1 src
    *[Case(f"v3-mxfp4-{out}", ("float4_e2m1fn", (2, 64)), (E8M0, (2, 2)), None, _out(PG(1, 32), out), version=3)
      for out in _OUT],
    *[Case(f"v3-pg-rank1-{s}", (s, (64,)), ("float32", (2,)), None, PG(32), version=3)
      for s in ("int2", "float4_e2m1fn", "int8", "float6_e3m2fn")],
    # -- zero points: the code's own type, other integer types, int32 far from 0, float codes' zeros ----
    *[Case(f"v3-pt-{s}-zp-{s}", (s, (3, 5)), ("float16", ()), (s, ()), PT, version=3) for s in _INT_3],
    *[Case(f"v3-pg-{s}-zp-{s}", (s, (4, 64)), ("float32", (4, 2)), (s, (4, 2)), PG(1, 32), version=3)
      for s in ("int2", "uint2", "int16", "uint16")],
    Case("v3-pc-int2-zp-int32", ("int2", (4, 6)), ("float32", (6,)), ("int32", (6,)), PC(1), version=3),
    Case("v3-pc-int32-zp-int32", ("int32", (4, 6)), ("float32", (6,)), ("int32", (6,)), PC(1), version=3),
    Case("v3-pg-uint2-zp-uint8", ("uint2", (4, 64)), (E8M0, (4, 2)), ("uint8", (4, 2)), _out(PG(1, 32), "float32"),
         version=3),
    Case("v3-pc-uint16-zp-int2", ("uint16", (4, 6)), ("bfloat16", (6,)), ("int2", (1,)), PC(1), version=3),
    *[Case(f"v3-pt-{s}-zero-zp", (s, (3, 5)), ("float32", ()), (s, ()), PT, version=3)
      for s in ("float8_e4m3fn", "float4_e2m1fn")],
    Case("v3-pg-float8-zero-zps", ("float8_e5m2", (4, 64)), ("float16", (4, 2)), ("float8_e5m2", (4, 2)),
         PG(1, 32), version=3),
    # -- invalid forms --------------------------------------------------------------------------------
    Case("v3-e8m0-no-output-dtype", ("float4_e2m1fn", (2, 64)), (E8M0, (2, 2)), None, PG(1, 32),
         bad("output_dtype"), version=3),
    *[Case(f"v3-output-dtype-{od}", ("int8", (2, 3)), ("float32", (1,)), None, {**PT, "output_dtype": od},
           bad("output_dtype"), version=3) for od in (11, 3, 0)],
    Case("v3-int-codes-float-zps", ("int4", (2, 3)), ("float32", (1,)), ("float8_e4m3fn", (1,)), PT, bad("zps"),
         version=3),
    Case("v3-float-codes-int-zps", ("float8_e4m3fn", (2, 3)), ("float32", (1,)), ("int8", (1,)), PT, bad("zps"),
         version=3),
    Case("v3-float-codes-other-float-zps", ("float4_e2m1fn", (2, 3)), ("float32", (1,)), ("float8_e4m3fn", (1,)),
         PT, bad("zps"), version=3),
    *[Case(f"v3-bad-src-{d}", (d, (2, 3)), ("float32", (1,)), None, PT, bad("src"), version=3)
      for d in ("int64", "uint32", "float16", "bool")],
    *[Case(f"v3-bad-scales-{d}", ("int2", (2, 3)), (d, (1,)), None, PT, bad("scales"), version=3)
      for d in ("float64", "float8_e4m3fn", "uint8")],
    Case("v3-dst-declared-float16", ("int8", (2, 3)), ("float32", (1,)), None, {**PT, "output_dtype": 16},
         bad("dst"), version=3, dst="float16"),
]
VALID_3 = [c for c in CASES_3 if c.valid]
INVALID_3 = [c for c in CASES_3 if not c.valid]
ALL_CASES = CASES + CASES_2 + CASES_3
ALL_VALID = VALID + VALID_2 + VALID_3
ALL_INVALID = INVALID + INVALID_2 + INVALID_3


def ids(cases):
    return [c.id for c in cases]



def case_model(case, *, node_name="dq", opset=21, inputs_as="inputs", arrays=None, domain_version=None,
               initializers=None) -> onnx.ModelProto:
    """The row as a model: src, scales (and zps) as graph inputs, or scales/zps as initializers
    (inputs_as="initializers"), or exactly the named ones (`initializers`, e.g. {"src"})."""
    if initializers is None:
        initializers = {"scales", "zps"} if inputs_as == "initializers" else set()
    names = ["src", "scales"] + ([] if case.zps is None else ["zps"])
    decls = [case.src, case.scales] + ([] if case.zps is None else [case.zps])
    node = onnx.helper.make_node("DynamicDequantize", names, ["dst"], name=node_name, domain=dyndq.DOMAIN)
    for key, value in case.attrs.items():  # typed by the op's own kinds (an empty list has no type of its own)
        spec = case.op.attribute(key)
        node.attribute.append(make_attribute(key, value, spec.kind) if spec else helper.make_attribute(key, value))
    graph_inputs, inits = [], []
    for i, (name, (dtype, shape)) in enumerate(zip(names, decls)):
        if name in initializers:
            inits.append(onnx.numpy_helper.from_array(arrays[i], name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, elem_type(dtype), list(shape)))
    given = case.dst or case.dst_dtype
    out = helper.make_tensor_value_info("dst", elem_type(given), list(case.src[1]))
    graph = helper.make_graph([node], "case", graph_inputs, [out], initializer=inits)
    imports = [helper.make_opsetid("", opset), dyndq.opset_import(case.version if domain_version is None else domain_version)]
    return helper.make_model(graph, opset_imports=imports, ir_version=dyndq.plumbing.ir.ir_version_for(imports))
