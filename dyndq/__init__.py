"""dyndq: oneDNN Graph's DynamicDequantize as a first-class ONNX op.

Importing dyndq attaches every part (shape function, kernel, converter) to its
op handle and registers every op version with ONNX's schema registry, so
`onnx.checker` and `onnx.shape_inference` understand graphs that hold them.
"""
from dyndq.opdefs import DOMAIN, DYNAMIC_DEQUANTIZE_1, Problem, TensorSpec, ValidationError

# The parts attach themselves to the op handles when imported.
from dyndq import shape_inference as _shape_inference  # noqa: F401
from dyndq import kernels as _kernels  # noqa: F401
from dyndq import converters as _converters  # noqa: F401
from dyndq.schema import register_all as _register_all

from dyndq.build import make_model, make_node, opset_import
from dyndq.check import check, validate
from dyndq.kernels.dynamic_dequantize import dynamic_dequantize
from dyndq.reference import reference_evaluator
from dyndq.export import ExportError, ExportReport, export, export_with_report
from dyndq.lift import LiftReport, lift, lift_with_report
from dyndq.run import run

_register_all()

__version__ = "0.1.0"

__all__ = [
    "DOMAIN",
    "DYNAMIC_DEQUANTIZE_1",
    "Problem",
    "TensorSpec",
    "ValidationError",
    # building and checking graphs
    "make_model",
    "make_node",
    "opset_import",
    "check",
    "validate",
    # running
    "dynamic_dequantize",
    "reference_evaluator",
    "run",
    # standard ONNX
    "ExportError",
    "ExportReport",
    "export",
    "export_with_report",
    "LiftReport",
    "lift",
    "lift_with_report",
]
