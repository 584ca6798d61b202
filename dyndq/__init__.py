"""dyndq: oneDNN Graph's DynamicDequantize as a first-class ONNX op.

Importing dyndq registers every op version with ONNX's schema registry, so
`onnx.checker` and `onnx.shape_inference` understand graphs that hold them.
"""
from dyndq.opdefs import DOMAIN, DYNAMIC_DEQUANTIZE_1, Problem, TensorSpec, ValidationError
from dyndq import shape_inference as _shape_inference  # noqa: F401  (attaches the shape functions)
from dyndq.schema import register_all as _register_all
from dyndq.build import make_model, make_node, opset_import
from dyndq.check import check, validate
# The NumPy kernel and the reference evaluator (kernels/dynamic_dequantize.py, dyndq/reference.py).
from dyndq.kernels.dynamic_dequantize import dynamic_dequantize  # attaches the kernel
from dyndq.reference import reference_evaluator

_register_all()

__version__ = "0.1.0"

__all__ = [
    "DOMAIN",
    "DYNAMIC_DEQUANTIZE_1",
    "Problem",
    "TensorSpec",
    "ValidationError",
    "check",
    "validate",
    "make_model",
    "make_node",
    "opset_import",
    "dynamic_dequantize",
    "reference_evaluator",
]

# Running graphs (dyndq/run.py); the command line lives in dyndq/cli.py.
from dyndq.run import run  # noqa: E402

__all__ += ["run"]

# Export to standard ONNX and lifting DequantizeLinear (dyndq/export.py, dyndq/lift.py).
from dyndq import converters as _converters  # noqa: E402,F401  (attaches the converters)
from dyndq.export import ExportError, ExportReport, export, export_with_report  # noqa: E402
from dyndq.lift import LiftReport, lift, lift_with_report  # noqa: E402

__all__ += ["ExportError", "ExportReport", "export", "export_with_report", "LiftReport", "lift", "lift_with_report"]
