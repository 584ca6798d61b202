"""dyndq: oneDNN Graph's DynamicDequantize as a first-class ONNX op.

Importing dyndq attaches the shape functions and kernels to their op handles
and registers every op version with ONNX's schema registry as soon as onnx is
imported (at once if it already is), so `onnx.checker` and
`onnx.shape_inference` understand graphs that hold them.

The face is loaded lazily: `import dyndq.kernels` or `dyndq.shape_inference`
needs NumPy (and ml_dtypes) only and never imports onnx; `dyndq.check`,
`dyndq.export` and the other graph operations import their module on first use.
"""
import os as _os
from importlib import import_module, metadata

# Imported from a clone rather than from an install (`python -m pytest` or a script in the
# clone's root puts its dyndq/ folder, the face alone, ahead of what is installed), the parts
# live beside this folder, not in it: the clone's root joins this package's path, so that
# dyndq.opdefs, dyndq.kernels, ... are its opdefs/, kernels/, ... as an install maps them.
if not _os.path.isdir(_os.path.join(__path__[0], "opdefs")):
    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    if _os.path.isfile(_os.path.join(_root, "opdefs", "__init__.py")):
        __path__.append(_root)

from dyndq.opdefs import (DOMAIN, DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2, DYNAMIC_DEQUANTIZE_3, Problem,
                          TensorSpec, ValidationError)

# The parts that need no onnx attach themselves to the op handles when imported.
from dyndq import shape_inference as _shape_inference  # noqa: F401
from dyndq import kernels as _kernels  # noqa: F401
from dyndq.kernels.dynamic_dequantize import dynamic_dequantize
from dyndq import registration as _registration

try:
    __version__ = metadata.version("dyndq")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# public name -> the module that defines it, imported on first use
_LAZY = {
    "make_model": "dyndq.build",
    "make_node": "dyndq.build",
    "opset_import": "dyndq.build",
    "check": "dyndq.checker",
    "validate": "dyndq.checker",
    "reference_evaluator": "dyndq.reference",
    "ExportError": "dyndq.exporter",
    "ExportReport": "dyndq.exporter",
    "export": "dyndq.exporter",
    "export_with_report": "dyndq.exporter",
    "LiftReport": "dyndq.lifter",
    "lift": "dyndq.lifter",
    "lift_with_report": "dyndq.lifter",
    "run": "dyndq.runner",
    "runtime_parity": "dyndq.parity",
    "ModelFileError": "dyndq.atomic_writes",
    "load_model": "dyndq.model_files",
    "save_model": "dyndq.model_files",
    "quantize": "dyndq.quantization",
    "QuantizeReport": "dyndq.quantization",
    "import_weights": "dyndq.checkpoints",
    "ImportReport": "dyndq.checkpoints",
    "verify": "dyndq.verification",
    "VerifyReport": "dyndq.verification",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dyndq' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


_registration.install()

__all__ = [
    "DOMAIN",
    "DYNAMIC_DEQUANTIZE_1",
    "DYNAMIC_DEQUANTIZE_2",
    "DYNAMIC_DEQUANTIZE_3",
    "Problem",
    "TensorSpec",
    "ValidationError",
    "dynamic_dequantize",
    *_LAZY,
]
