"""DynamicDequantize, as data: oneDNN Graph's op, versions 1 and 2, and our version 3.

dst = (src - zps) * scales, with scales and zero points given at run time as
inputs.  One source document of the op (an early preview of oneDNN's
documentation) divides by the scale; oneDNN's backend, its tests and every
later document multiply, as ONNX's DequantizeLinear does.  We multiply.

Version 1: int8/uint8 src, float32 scales and dst, per tensor or per channel.
Version 2 (oneDNN >= 3.7): also int4/uint4 src and zero points, float16 and
bfloat16 scales and dst, and per-group quantization (`group_shape`).  Every
node valid under version 1 means exactly the same under version 2.
Version 3 (ours, ahead of oneDNN): every code type of ONNX's DequantizeLinear-28 (int2 to
int32, float8, float6, float4), float8e8m0 scales, and the output dtype as an attribute
(`output_dtype`, default the scales' dtype).  Every node valid under version 2 means exactly
the same under version 3.
"""
from __future__ import annotations

from .attributes import AttrKind, Attribute
from .registry import OpVersion, Param, TypeConstraint, register

DOMAIN = "org.dyndq"

PER_TENSOR = "per_tensor"
PER_CHANNEL = "per_channel"
PER_GROUP = "per_group"
QTYPES = (PER_TENSOR, PER_CHANNEL)  # version 1's
QTYPES_2 = (PER_TENSOR, PER_CHANNEL, PER_GROUP)

# Version 3's code types, DequantizeLinear-28's T1 (in the order ONNX lists them)
INTEGER_CODES_3 = ("int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32")
FLOAT_CODES_3 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn",
                 "float6_e2m3fn", "float6_e3m2fn")
SCALES_3 = ("float32", "float16", "bfloat16", "float8_e8m0fnu")
OUTPUTS_3 = ("float32", "float16", "bfloat16")

DYNAMIC_DEQUANTIZE_1 = register(
    OpVersion(
        name="DynamicDequantize",
        domain=DOMAIN,
        since_version=1,
        doc=(
            "Converts a quantized int8/uint8 tensor to float32 with scales and zero points "
            "given as inputs: dst = float32(int64(src) - int64(zps)) * scales, per tensor "
            "(one scale and zero point) or per channel (one per index of src along axis). "
            "A missing zps means zero points of 0 (symmetric)."
        ),
        inputs=(
            Param("src", "T1", "The quantized tensor."),
            Param(
                "scales",
                "T2",
                "per_tensor: one element, shape [1] or []; per_channel: 1-D, src.shape[axis] elements.",
            ),
            Param(
                "zps",
                "T3",
                "Zero points. per_tensor: one element; per_channel: the shape of scales, "
                "or one element shared by every channel. Absent means 0.",
                optional=True,
            ),
        ),
        outputs=(Param("dst", "T2", "The dequantized tensor, src's shape."),),
        attributes=(
            Attribute(
                "qtype",
                AttrKind.STRING,
                PER_TENSOR,
                "Which dequantization: per_tensor or per_channel.",
                allowed=QTYPES,
            ),
            Attribute(
                "axis",
                AttrKind.INT,
                1,
                "The channel axis for per_channel, in [-r, r-1] with r = rank(src); ignored for per_tensor.",
            ),
        ),
        type_constraints=(
            TypeConstraint("T1", ("int8", "uint8"), "The quantized src: int8 or uint8."),
            TypeConstraint("T2", ("float32",), "Scales and dst: float32."),
            TypeConstraint("T3", ("int8", "uint8", "int32"), "Zero points: int8, uint8 or int32."),
        ),
    )
)


DYNAMIC_DEQUANTIZE_2 = register(
    OpVersion(
        name="DynamicDequantize",
        domain=DOMAIN,
        since_version=2,
        doc=(
            "Converts a quantized int8/uint8/int4/uint4 tensor to float32, float16 or bfloat16 "
            "(the dtype of scales) with scales and zero points given as inputs: "
            "dst = T2(float32(int64(src) - int64(zps)) * float32(scales)), rounded to nearest even "
            "once for the float32 product and once more to T2; per tensor, per channel (along axis) "
            "or per group (one scale per block of group_shape elements). A missing zps means 0."
        ),
        inputs=(
            Param("src", "T1", "The quantized tensor."),
            Param(
                "scales",
                "T2",
                "per_tensor: one element, shape [1] or []; per_channel: 1-D, src.shape[axis] elements; "
                "per_group: src's rank, src.shape[i] / group_shape[i] in each dim i.",
            ),
            Param(
                "zps",
                "T3",
                "Zero points. per_tensor: one element; per_channel: the shape of scales, or one element; "
                "per_group: the shape of scales. Absent means 0.",
                optional=True,
            ),
        ),
        outputs=(Param("dst", "T2", "The dequantized tensor: src's shape, scales' dtype."),),
        attributes=(
            Attribute(
                "qtype",
                AttrKind.STRING,
                PER_TENSOR,
                "Which dequantization: per_tensor, per_channel or per_group.",
                allowed=QTYPES_2,
            ),
            Attribute(
                "axis",
                AttrKind.INT,
                1,
                "The channel axis for per_channel, in [-r, r-1] with r = rank(src); ignored otherwise.",
            ),
            Attribute(
                "group_shape",
                AttrKind.INTS,
                None,
                "per_group (required there): the block of src sharing one scale, one entry >= 1 per "
                "dim of src, each dividing src's dim exactly; ignored otherwise.",
            ),
        ),
        type_constraints=(
            TypeConstraint("T1", ("int8", "uint8", "int4", "uint4"), "The quantized src."),
            TypeConstraint("T2", ("float32", "float16", "bfloat16"), "Scales and dst."),
            TypeConstraint("T3", ("int8", "uint8", "int32", "int4", "uint4"), "Zero points, with any T1."),
        ),
    )
)


DYNAMIC_DEQUANTIZE_3 = register(
    OpVersion(
        name="DynamicDequantize",
        domain=DOMAIN,
        since_version=3,
        doc=(
            "Converts a tensor of codes of any type ONNX's DequantizeLinear-28 takes (int2 to int32, "
            "float8, float6, float4) to float32, float16 or bfloat16 (output_dtype, default the dtype of "
            "scales) with scales and zero points given as inputs: dst = OT(float32(decode(src) - "
            "decode(zps)) * float32(decode(scales))): the integer difference exact, then rounded to "
            "float32; float codes and float8e8m0 scales (2^(e-127), 0xFF NaN) decoded exactly; the "
            "product rounded to float32, then to OT, each to nearest even; per tensor, per channel "
            "(along axis) or per group (one scale per block of group_shape elements). A missing zps "
            "means 0; float codes take zero points of 0 only, of either sign (subtracted as IEEE arithmetic does: "
            "a -0 code minus a -0 zero point is +0)."
        ),
        inputs=(
            Param("src", "T1", "The codes."),
            DYNAMIC_DEQUANTIZE_2.inputs[1],  # scales: the same shapes
            Param(
                "zps",
                "T3",
                "Zero points (with float codes: src's dtype, all 0). per_tensor: one element; per_channel: "
                "the shape of scales, or one element; per_group: the shape of scales. Absent means 0.",
                optional=True,
            ),
        ),
        outputs=(Param("dst", "T4", "The dequantized tensor: src's shape, output_dtype's dtype."),),
        attributes=(
            *DYNAMIC_DEQUANTIZE_2.attributes,  # qtype, axis, group_shape: as version 2 has them
            Attribute(
                "output_dtype",
                AttrKind.INT,
                None,
                "The dtype of dst, a TensorProto data type: FLOAT (1), FLOAT16 (10) or BFLOAT16 (16). "
                "Absent: the dtype of scales (then required when scales are float8e8m0).",
            ),
        ),
        type_constraints=(
            TypeConstraint("T1", INTEGER_CODES_3 + FLOAT_CODES_3, "The codes: integer or float."),
            TypeConstraint("T2", SCALES_3, "The scales."),
            TypeConstraint("T3", INTEGER_CODES_3 + FLOAT_CODES_3,
                           "Zero points: any integer type with integer codes; with float codes src's own type, "
                           "and every zero point 0 (as DequantizeLinear allows)."),
            TypeConstraint("T4", OUTPUTS_3, "dst: output_dtype, or the dtype of scales."),
        ),
    )
)
