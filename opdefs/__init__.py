"""The registry and the op definitions, as data (NumPy only for the dtype table; no ONNX)."""
from . import dtypes
from .attributes import REQUIRED, AttrKind, Attribute
from .problems import Problem, ValidationError
from .spec import TensorSpec
from .registry import (
    LiftPlan,
    LiftRefusal,
    MissingPartError,
    Needs,
    OpVersion,
    Param,
    TypeConstraint,
    all_versions,
    domains,
    lifters,
    newest,
    newest_domain_version,
    ops_of,
    qualname,
    register,
    resolve,
    versions_of,
)
from .dynamic_dequantize import DOMAIN, DYNAMIC_DEQUANTIZE_1, PER_CHANNEL, PER_TENSOR, QTYPES

__all__ = [
    "DOMAIN",
    "DYNAMIC_DEQUANTIZE_1",
    "PER_CHANNEL",
    "PER_TENSOR",
    "QTYPES",
    "REQUIRED",
    "AttrKind",
    "Attribute",
    "LiftPlan",
    "LiftRefusal",
    "MissingPartError",
    "Needs",
    "OpVersion",
    "Param",
    "Problem",
    "TensorSpec",
    "TypeConstraint",
    "ValidationError",
    "all_versions",
    "domains",
    "dtypes",
    "lifters",
    "newest",
    "newest_domain_version",
    "ops_of",
    "qualname",
    "register",
    "resolve",
    "versions_of",
]
