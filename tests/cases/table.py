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
from onnx import helper, numpy_helper

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


# -- the independent oracle and how outputs are compared, for every engine's tests ----------------


def oracle(src, scales, zps=None, qtype="per_tensor", axis=1):
    """Version 1's arithmetic, float32(int64(src) - int64(zp)) * scale: version 2's with float32 scales."""
    return oracle_2(src, np.asarray(scales).astype(np.float32), zps, qtype, axis)


def oracle_2(src, scales, zps=None, qtype="per_tensor", axis=1, group_shape=None):
    """Version 2's arithmetic: version 3's with dst of the scales' dtype."""
    return oracle_3(src, scales, zps, qtype, axis, group_shape)


def along_src(src, scale, zp, qtype, axis, group_shape):
    """Scales and zero points placed against src: repeated over each group (per_group), shaped
    to src's axis (per_channel), or scalars (per_tensor)."""
    if qtype == "per_group":
        for i, g in enumerate(group_shape):
            scale = np.repeat(scale, g, axis=i)
            zp = np.repeat(zp, g, axis=i) if zp.ndim else zp
    elif qtype == "per_channel":
        shape = [1] * src.ndim
        shape[axis] = src.shape[axis]
        scale = scale.reshape(shape)
        zp = zp.reshape(()) if zp.size == 1 else zp.reshape(shape)
    else:
        scale, zp = scale.reshape(()), zp.reshape(())
    return scale, zp


def oracle_3(src, scales, zps=None, qtype="per_tensor", axis=1, group_shape=None, output_dtype=None):
    """Version 3's arithmetic written plainly with NumPy and ml_dtypes:
    OT(float32(decode(src) - decode(zp)) * float32(decode(scale))), parameters repeated to src's
    shape: integer codes' difference in int64, float codes (and float8e8m0 scales) decoded by
    ml_dtypes' casts and their zero points subtracted in float32 (IEEE's: a -0 code minus a -0 zero
    point is +0), OT output_dtype's or the scales' dtype; a float16 NaN is 0x7E00, whatever its
    sign and payload."""
    src = np.asarray(src)
    t2 = np.asarray(scales).dtype if output_dtype is None else dtypes.by_onnx(output_dtype).numpy
    scale = np.asarray(scales).astype(np.float32)
    float_codes = src.dtype.name in dyndq.opdefs.FLOAT_CODES_3
    zp = np.zeros((), np.int64) if zps is None else np.asarray(zps).astype(np.float32 if float_codes else np.int64)
    scale, zp = along_src(src, scale, zp, qtype, axis, group_shape)
    with np.errstate(all="ignore"):
        centered = (src.astype(np.float32) - zp.astype(np.float32) if float_codes
                    else (src.astype(np.int64) - zp).astype(np.float32))
        dst = np.asarray((centered * scale).astype(np.dtype(t2.name)))
    if dst.dtype.name == "float16":  # every float16 NaN is the one quiet NaN (README, "The op")
        dst.view(np.uint16)[np.isnan(dst)] = 0x7E00  # (a view in any layout: .astype keeps src's)
    return dst


def random_array(rng, dtype, shape, *, onednn=False) -> np.ndarray:
    """Random values of a dtype (our name, or oneDNN's short name with onednn=True)."""
    name = dtypes.by_onednn(dtype).name if onednn else dtype
    return _random(rng, name, shape)


def same_bits(a, b) -> bool:
    """Float arrays of one dtype and shape with the very same bits (NaN payloads and -0 included)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind not in "fV" and a.dtype.name != "bfloat16":
        return False
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(np.ascontiguousarray(a).view(width), np.ascontiguousarray(b).view(width))


def same_values(a, b) -> bool:
    """Arrays of one dtype and shape with the very same bytes: for floats, the same bits
    (the sign of zero and NaN payloads included), as every engine comparison must be."""
    a, b = np.asarray(a), np.asarray(b)
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


def run_ort(model, feeds: dict, *, level: str = "all", outputs=None) -> list:
    """Run a model (a ModelProto, or a path: external data is found beside it) in ONNX Runtime, CPU,
    one thread, through dyndq's runner of it (`dyndq.ort_session.OrtSession`); `level` by the house's
    name (ONNX Runtime's default: "all"), `outputs` the names to fetch (default: the graph's outputs)."""
    from dyndq.ort_session import OrtSession

    if isinstance(model, onnx.ModelProto):
        return OrtSession(model, level=level, threads=1).run(outputs, feeds)
    path = str(model)
    return OrtSession(onnx.load(path, load_external_data=False), level=level, threads=1, path=path).run(outputs, feeds)


def vi(name: str, dtype, shape) -> onnx.ValueInfoProto:
    """A tensor value info; dtype is an ONNX element type or anything NumPy names."""
    return helper.make_tensor_value_info(name, dtype if isinstance(dtype, int) else elem_type(dtype), shape)


# -- opcheck: one row through every layer, as torch.library.opcheck does for an op -----------------

# ONNX Runtime's Python API takes no NumPy feeds of these: such arrays go in as initializers.
_NOT_FEEDABLE = ("int4", "uint4", "bfloat16", "int2", "uint2", "float8_e8m0fnu", *dyndq.opdefs.FLOAT_CODES_3)


def _onnxruntime_holds(case) -> bool:
    """Whether ONNX Runtime has tensors of the row's dtypes (else only constants of them run there)."""
    from dyndq.converters.engines import engine

    return all(engine("onnxruntime").holds(d) for d in (case.src[0], case.zps and case.zps[0]) if d)


def opcheck(case, *, seed: int = 0, onnxruntime: bool = True) -> None:
    """Check one valid row of the table with its own op version (case.op), for any version, in
    every layer (the one runner of the table's valid rows; invalid ones: `opcheck_invalid`):

    - the kernel: equal to the independent oracle (`oracle_2`) bit for bit;
    - the shape function: its spec is the kernel's output spec;
    - the model (`case_model`): onnx.checker's full check, ONNX's strict shape inference
      (dst's dtype and shape inferred, the declared ones cleared), and `dyndq.check` finding
      nothing, with scales/zps as graph inputs and as initializers;
    - `dyndq.run` on both engines (the reference evaluator through our kernel; ONNX Runtime after
      export, at its basic level, int4 and bfloat16 fed through the runner's exact boundary):
      one output "dst", the kernel's bits;
    - `dyndq.export` with scales/zps as graph inputs and as initializers (another seed): fully
      checked, no node of our domain left, and (initializers) ONNX Runtime at its default level
      gives the kernel's bits; a version-1 row lowers to one DequantizeLinear when its zero point
      is absent or of src's dtype, else to integer arithmetic (Cast, Sub, Mul).
    """
    from onnx.shape_inference import infer_shapes

    assert case.valid, f"{case.id} is an invalid row: opcheck_invalid judges it"
    op = case.op
    src, scales, zps = case.arrays(seed)
    got = _kernel_agrees(case, src, scales, zps)
    specs = [dyndq.TensorSpec.of(a) if a is not None else None for a in (src, scales, zps)]
    assert op.shape_inference(*specs, **case.attrs) == dyndq.TensorSpec.of(got)

    model = case_model(case)
    onnx.checker.check_model(model, full_check=True)
    loose = onnx.ModelProto()
    loose.CopyFrom(model)
    loose.graph.output[0].type.tensor_type.ClearField("shape")  # let inference fill it in
    loose.graph.output[0].type.tensor_type.elem_type = 0
    [inferred] = infer_shapes(loose, strict_mode=True).graph.output
    assert inferred.type.tensor_type.elem_type == elem_type(got.dtype.name), case.id
    assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == list(got.shape), case.id
    assert dyndq.check(model) == []
    assert dyndq.check(case_model(case, inputs_as="initializers", arrays=(src, scales, zps))) == []

    feeds = {"src": src, "scales": scales, **({} if zps is None else {"zps": zps})}
    engines = ("reference", "onnxruntime") if onnxruntime else ("reference",)
    for engine in engines:
        if engine == "onnxruntime" and not _onnxruntime_holds(case):
            continue  # it has no tensors of src's (or zps') dtype: constants only, below
        out = dyndq.run(model, feeds, engine=engine)
        assert list(out) == ["dst"] and same_bits(out["dst"], got), (case.id, engine)
    standard = dyndq.export(model)
    _exports_right(case, standard)
    if case.version >= 3:  # standard ONNX at the opset its types need: ONNX's own reference engine runs it
        out = dyndq.run(standard, feeds, engine="reference")
        assert same_bits(out["dst"], got), (case.id, "export onnx on onnx.reference")
    if not onnxruntime:
        return

    src, scales, zps = case.arrays(seed + 1)
    got = _kernel_agrees(case, src, scales, zps)
    feeds = {"src": src, "scales": scales, **({} if zps is None else {"zps": zps})}
    fixed = {"scales", "zps"} | ({"src"} if src.dtype.name in _NOT_FEEDABLE else set())
    exported = dyndq.export(case_model(case, initializers=fixed, arrays=(src, scales, zps)), target="onnxruntime")
    _exports_right(case, exported)
    if got.dtype.name == "bfloat16":  # ONNX Runtime returns no bfloat16: an exact Cast to float32 at the boundary
        exported = _bfloat16_output_as_float32(exported)
    [ort] = run_ort(exported, {k: v for k, v in feeds.items() if k not in fixed})
    if got.dtype.name == "bfloat16":
        ort = ort.astype(got.dtype)  # exact: every bfloat16 is a float32
    assert same_bits(ort, got), case.id


def _kernel_agrees(case, src, scales, zps) -> np.ndarray:
    got = case.op.kernel(src, scales, zps, **case.attrs)
    attrs = {"qtype": "per_tensor", "axis": 1, **case.attrs}
    axis = attrs["axis"] % max(1, src.ndim)
    want = oracle_3(src, scales, zps, attrs["qtype"], axis, attrs.get("group_shape"), attrs.get("output_dtype"))
    assert same_bits(got, want), case.id
    return got


def _exports_right(case, exported: onnx.ModelProto) -> None:
    """Standard ONNX that the checker fully checks; version 1's forms as its converter promises."""
    onnx.checker.check_model(exported, full_check=True)
    ops = [n.op_type for n in exported.graph.node]
    assert not any(n.domain == dyndq.DOMAIN for n in exported.graph.node), ops
    if case.version != 1:
        return
    same = case.zps is None or case.zps[0] == case.src[0]
    if same:
        assert ops.count("DequantizeLinear") == 1, (case.id, ops)
        assert set(ops) <= {"DequantizeLinear", "Reshape", "Constant", "Expand", "Shape"}, (case.id, ops)
    else:
        assert set(ops) <= {"Cast", "Sub", "Mul", "Reshape", "Constant"}, (case.id, ops)


def opcheck_invalid(case, *, seed: int = 0) -> None:
    """Check one invalid row: `dyndq.check` names exactly the row's bad arguments, each problem
    naming the node (its index, graph and op), what was found and what is allowed; the shape
    function and the kernel (with and without `out`) name the same (a declared dst is a graph's:
    neither has one); onnx.checker's full check refuses the model naming the node, and, where
    the refusal is our inference's, every bad argument."""
    import pytest

    from dyndq.schema import MARK

    assert not case.valid, f"{case.id} is a valid row: opcheck judges it"
    op = case.op
    src, scales, zps = case.arrays(seed)
    problems = dyndq.check(case_model(case, node_name="weights_dq"))
    assert {p.argument for p in problems} == set(case.bad), (case.id, problems)
    for p in problems:
        assert (p.node, p.node_index, p.graph) == ("weights_dq", 0, "main"), case.id
        assert p.op == f"{dyndq.DOMAIN}::DynamicDequantize" and p.found and p.allowed, case.id
        assert "weights_dq" in str(p) and p.argument in str(p) and p.allowed in str(p), case.id
    want = set(case.bad) - {"dst"}
    specs = [dyndq.TensorSpec(*a) if a is not None else None for a in (case.src, case.scales, case.zps)]
    try:
        op.shape_inference(*specs, **case.attrs)
        found = set()
    except dyndq.ValidationError as e:
        found = {p.argument for p in e.problems}
    assert found == want, case.id
    if want:
        with pytest.raises(dyndq.ValidationError) as e:
            op.kernel(src, scales, zps, **case.attrs)
        assert {p.argument for p in e.value.problems} == want, str(e.value)
        assert all(p.found and p.allowed for p in e.value.problems), case.id
        t2 = scales.dtype if scales.dtype.name in op.allowed_dtypes("dst") else np.dtype(np.float32)
        with pytest.raises(dyndq.ValidationError):
            op.kernel(src, scales, zps, out=np.empty(src.shape, t2), **case.attrs)
    with pytest.raises((onnx.shape_inference.InferenceError, onnx.checker.ValidationError)) as e:
        onnx.checker.check_model(case_model(case, node_name="bad_dq"), full_check=True)
    assert "bad_dq" in str(e.value), case.id
    if MARK in str(e.value):  # our own rules, not ONNX's type-constraint check
        assert all(arg in str(e.value) for arg in case.bad), (case.id, str(e.value))


def _bfloat16_output_as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The bfloat16 dst followed by an exact Cast to float32, as the graph's output."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    dst = g.output[0].name
    for n in g.node:
        for k, name in enumerate(n.output):
            if name == dst:
                n.output[k] = dst + "_bf16"
    g.node.append(helper.make_node("Cast", [dst + "_bf16"], [dst], to=onnx.TensorProto.FLOAT))
    g.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return out


# -- ONNX's own DequantizeLinear backend cases: named cheaply, built once, on first use ---------------


def backend_case_names() -> list[str]:
    """The names of ONNX's DequantizeLinear backend test cases, read from the source that
    defines them (building them all takes seconds; collection needs only their names)."""
    import inspect
    import re

    import onnx.backend.test.case.node.dequantizelinear as source

    return sorted(set(re.findall(r'name="(test_dequantizelinear[a-z0-9_]*)"', inspect.getsource(source))))


_BACKEND: dict = {}


def backend_case(name: str):
    """One of ONNX's DequantizeLinear backend cases (all are built on the first call, once per run)."""
    if not _BACKEND:
        import warnings

        from onnx.backend.test.case.node import collect_testcases

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _BACKEND.update({c.name: c for c in collect_testcases("DequantizeLinear")})
    return _BACKEND[name]


# The demo MLP's output y comes out of float32 MatMuls, which each engine sums in its own order
# (bit-identical on some CPUs, not on others): engines are compared on y within this tolerance;
# our op's outputs, always to the bit.
MATMUL_RTOL, MATMUL_ATOL = 1e-5, 1e-6


def close_after_matmul(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.allclose(a, b, rtol=MATMUL_RTOL, atol=MATMUL_ATOL)


# -- the compiled kernel: whether its tests run --------------------------------------------------

# Tests of the compiled kernel carry the `native` mark (or take kernel_path's compiled paths).
# Where it is not built (no C compiler at install) or switched off (DYNDQ_NATIVE=0) they are
# skipped from the one line in needs_native, so that pytest's summary says why in one line;
# with DYNDQ_REQUIRE_NATIVE=1 (as .ci/run sets it) a missing compiled kernel ends the run as a
# failure instead (tests/conftest.py), so CI can never skip it silently.
REQUIRE_NATIVE_ENV = "DYNDQ_REQUIRE_NATIVE"


def native_required() -> bool:
    """Whether DYNDQ_REQUIRE_NATIVE is set and not to an off value (parallel.switched_off's words)."""
    import os

    from dyndq.kernels.parallel import switched_off

    return bool(os.environ.get(REQUIRE_NATIVE_ENV)) and not switched_off(REQUIRE_NATIVE_ENV)


def why_not_native() -> str | None:
    """Why the compiled-kernel tests cannot run here (None: they can)."""
    from dyndq.kernels import native
    from dyndq.kernels.parallel import NATIVE_ENV, switched_off

    if not native.built():
        return f"the compiled kernel is {native.info()['why']}"
    if switched_off(NATIVE_ENV):
        return f"{NATIVE_ENV}=0 switches the compiled kernel off"
    return None


def needs_native() -> None:
    """Skip the calling test unless the compiled kernel can run (the one place that says why)."""
    import pytest

    why = why_not_native()
    if why:
        pytest.skip(f"compiled-kernel tests skipped, the NumPy kernel is tested alone: {why}")


def budget(path: str, full: int) -> int:
    """A property test's number of examples on a kernel path (tests/kernels/conftest.py,
    kernel_path): the full budget on the path that serves calls here (the compiled kernel at
    this CPU's level where it runs, else the NumPy kernel), a tenth (at least 25) on the others,
    which the same properties cover at the serving path's full budget."""
    serving = "compiled" if why_not_native() is None else "numpy"
    return full if path == serving else max(25, full // 10)


# -- small models the edge-case tests share (tests/dyndq/test_*_edge_cases.py) -----------------------

def call(capsys, *argv):
    """dyndq's CLI on argv (str()'d), through its real entry point: (exit code, stdout, stderr)."""
    from dyndq.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def matmul_model() -> onnx.ModelProto:
    """y = x @ DynamicDequantize(w, s): x float32[2, 3], w int8[3, 2]."""
    node = dyndq.make_node(["w", "s"], ["wf"], name="dq")
    g = helper.make_graph(
        [node, helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.arange(6, dtype=np.int8).reshape(3, 2), "w"), numpy_helper.from_array(np.array([0.5], np.float32), "s")])
    return dyndq.make_model(g)


def dq_input_model() -> onnx.ModelProto:
    """y = DynamicDequantize(w, s) with both as graph inputs of free shape."""
    g = helper.make_graph(
        [dyndq.make_node(["w", "s"], ["y"], name="dq")], "g",
        [helper.make_tensor_value_info("w", onnx.TensorProto.INT8, [None, None]), helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, None])])
    return dyndq.make_model(g)


X = np.arange(6, dtype=np.float32).reshape(2, 3)
Y = X @ (np.arange(6, dtype=np.float32).reshape(3, 2) * np.float32(0.5))


def sequence_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [dyndq.make_node(["a", "s"], ["da"], name="dqa"), dyndq.make_node(["b", "s"], ["db"], name="dqb"),
         helper.make_node("SequenceConstruct", ["da", "db"], ["seq"])], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.INT8, [2]), helper.make_tensor_value_info("b", onnx.TensorProto.INT8, [None])],
        [helper.make_tensor_sequence_value_info("seq", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0.5], np.float32), "s")])
    return dyndq.make_model(g)


A, B = np.array([1, 2], np.int8), np.array([3, 4, 5], np.int8)


# -- oneDNN graphs, written as JSON documents ---------------------------------------------------------

def lt(i, dtype, shape, prop="variable"):
    """A oneDNN logical tensor: id, dtype ("f32", "s8", ...), shape, strided."""
    return {"id": i, "dtype": dtype, "shape": list(shape), "stride": [], "layout_type": "strided", "property_type": prop}


def graph(*ops, inputs=None, outputs=None):
    doc = {"version": "3.9.0", "graph": list(ops)}
    if inputs is not None:
        doc["input_ports"] = inputs
    if outputs is not None:
        doc["output_ports"] = outputs
    return doc


def op(i, kind, ins, outs, **attrs):
    types = {bool: "bool", int: "s64", float: "f32", str: "string"}
    typed = {k: {"type": (("f32[]" if isinstance(v[0], float) else "s64[]") if isinstance(v, list) else types[type(v)]),
                 "value": v} for k, v in attrs.items()}
    return {"id": i, "name": f"{kind.lower()}_{i}", "kind": kind, "attrs": typed, "inputs": ins, "outputs": outs}


def both(model, feeds):
    return dyndq.run(model, feeds), dyndq.run(model, feeds, engine="onnxruntime")


def weighted_model():
    """MatMul with weights, Reshape, ReduceSum, ReduceMax and QuantizeLinear, all with constants."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
             helper.make_node("Reshape", ["y", "shape"], ["r"], name="flat"),
             helper.make_node("ReduceMax", ["r", "axes"], ["m"], name="top", keepdims=1),
             helper.make_node("Sub", ["r", "m"], ["d"], name="shift"),
             helper.make_node("ReduceSum", ["d", "axes"], ["s"], name="total", keepdims=0),
             helper.make_node("QuantizeLinear", ["s", "scale", "zp"], ["q"], name="quant")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([3, 2], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
             numpy_helper.from_array(np.array(-3, np.int8), "zp")]
    g = helper.make_graph(nodes, "weighted", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])], [helper.make_tensor_value_info("q", onnx.TensorProto.INT8, [3])],
                          inits)
    return dyndq.make_model(g)


def hand_model():
    """DynamicDequantize feeding a MatMul and an Add, in plain ONNX (no oneDNN metadata)."""
    vi = helper.make_tensor_value_info
    nodes = [dyndq.make_node(["w", "s", "z"], ["wd"], name="deq", qtype="per_channel", axis=1),
             helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
             helper.make_node("Add", ["y", "b"], ["out"], name="bias")]
    g = helper.make_graph(nodes, "hand", [vi("x", onnx.TensorProto.FLOAT, [2, 4]), vi("w", onnx.TensorProto.INT8, [4, 3]),
                                          vi("s", onnx.TensorProto.FLOAT, [3]), vi("z", onnx.TensorProto.INT8, [3]),
                                          vi("b", onnx.TensorProto.FLOAT, [3])],
                          [vi("out", onnx.TensorProto.FLOAT, [2, 3])])
    return dyndq.make_model(g)
