"""The registry and the op definitions, as data (no ONNX, no NumPy needed)."""
from .dynamic_dequantize import DOMAIN, DYNAMIC_DEQUANTIZE_1, PER_CHANNEL, PER_TENSOR, QTYPES
from .problems import Problem, ValidationError
from .spec import TensorSpec
from .registry import (
    Attribute,
    OpVersion,
    Param,
    TypeConstraint,
    all_versions,
    newest_domain_version,
    register,
    resolve,
    versions_of,
)

__all__ = [
    "DOMAIN",
    "DYNAMIC_DEQUANTIZE_1",
    "PER_CHANNEL",
    "PER_TENSOR",
    "QTYPES",
    "Problem",
    "ValidationError",
    "TensorSpec",
    "Attribute",
    "OpVersion",
    "Param",
    "TypeConstraint",
    "all_versions",
    "newest_domain_version",
    "register",
    "resolve",
    "versions_of",
]
