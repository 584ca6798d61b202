"""DynamicDequantize, as data: oneDNN Graph's op, version 1.

dst = (src - zps) * scales, per tensor or per channel, with scales and zero
points given at run time as inputs.  One source document of the op (an early
preview of oneDNN's documentation) divides by the scale; oneDNN's backend, its tests and
every later document multiply, as ONNX's DequantizeLinear does.  We multiply.
"""
from __future__ import annotations

from .attributes import AttrKind, Attribute
from .registry import OpVersion, Param, TypeConstraint, register

DOMAIN = "org.dyndq"

PER_TENSOR = "per_tensor"
PER_CHANNEL = "per_channel"
QTYPES = (PER_TENSOR, PER_CHANNEL)

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
