"""Weight-only quantization of float ONNX models into DynamicDequantize-2 graphs (-3 for 2-bit, MXFP4, NVFP4).

    import dyndq
    out, report = dyndq.quantize(model, bits=4, group_size=128, method="search")

The function is `dyndq.quantize` (also `dyndq.quantization.quantize`); this package, named
otherwise so that the name `dyndq.quantize` means the function only, holds its parts.

The numerics are pure NumPy functions of one weight (`rtn`, `search`, `numerics`, `fp4`), each
format is one module of `formats/` (its option checks, quantize, dequantize, nodes), the graph
side is separate (`plan` finds the weights, `rewrite` makes a format's nodes), and `quantizer`
hands its rule of kind QUANTIZE to the one walker (converters/walker.py), which applies it over
every scope; docs/quantize.md tells the whole story.
"""
from dyndq.quantization.options import FORMATS, SCALE_DTYPES, OptionError, QuantizeOptions
from dyndq.quantization.quantizer import NothingToQuantize, quantize, rank_methods
from dyndq.quantization.on_disk import EMITS, onednn_graph, quantize_file
from dyndq.quantization.numerics import METHODS
from dyndq.quantization.plan import OPS
from dyndq.quantization.report import LayerReport, OutputDifference, QuantizeReport

__all__ = ["EMITS", "FORMATS", "LayerReport", "METHODS", "NothingToQuantize", "OPS", "OptionError", "OutputDifference",
           "QuantizeOptions", "QuantizeReport", "SCALE_DTYPES", "onednn_graph", "quantize", "quantize_file",
           "rank_methods"]
