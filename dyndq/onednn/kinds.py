"""The one table of oneDNN kinds (`KINDS`: kind -> its `Handler`), filled by the family modules.

Every handler follows oneDNN's documented semantics (doc/graph/operations/*.md and the op
schemas in src/graph/interface/op_def.hpp): attributes it cannot honour, and dtypes outside
what the kind takes, are named as problems rather than guessed at.  Float arithmetic runs in
float32 between exact Casts (see emitter.py).
"""
from dyndq.onednn import elementwise, layout, matmul, normalization, quantization  # noqa: F401  (each registers its handlers)
from dyndq.onednn.handler import KINDS, Handler, inverse_table

# Kinds that no mapping can honour, and why: named as such rather than as unknown.
REFUSED = {
    "Dropout": "a kind ONNX engines can run alike: Dropout draws oneDNN's own random numbers (Philox, from "
               "its seed and offset inputs), which no ONNX op reproduces",
}

__all__ = ["KINDS", "REFUSED", "Handler", "inverse_table"]
