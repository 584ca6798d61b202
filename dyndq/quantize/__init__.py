"""Weight-only quantization of float ONNX models into DynamicDequantize-2 graphs.

    from dyndq.quantize import quantize          # or dyndq.quantize(model, ...)
    out, report = quantize(model, bits=4, group_size=128, method="search")

The numerics are pure NumPy functions of one weight (`rtn`, `search`, `numerics`), the
graph side is separate (`plan` finds the weights, `rewrite` makes the nodes), and
`quantizer` ties them together; docs/quantize.md tells the whole story.
"""
import sys
import types

from dyndq.quantize.quantizer import EMITS, SCALE_DTYPES, NothingToQuantize, OptionError, quantize
from dyndq.quantize.on_disk import onednn_graph, quantize_file
from dyndq.quantize.numerics import METHODS
from dyndq.quantize.plan import OPS
from dyndq.quantize.report import LayerReport, OutputError, QuantizeReport

__all__ = ["EMITS", "LayerReport", "METHODS", "NothingToQuantize", "OPS", "OptionError", "OutputError", "QuantizeReport",
           "SCALE_DTYPES", "onednn_graph", "quantize", "quantize_file"]


class _Callable(types.ModuleType):
    """`dyndq.quantize` is both this package and the function: importing a submodule
    (dyndq.quantize.rtn) binds the package as the attribute `quantize` of dyndq, so the
    package itself answers a call as the function does."""

    def __call__(self, *args, **kwargs):
        return quantize(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
