"""The one table of oneDNN kinds (`KINDS`: kind -> its `Handler`), filled by the family modules.

Every handler follows oneDNN's documented semantics (doc/graph/operations/*.md and the op
schemas in src/graph/interface/op_def.hpp): attributes it cannot honour, and dtypes outside
what the kind takes, are named as problems rather than guessed at.  Float arithmetic runs in
float32 between exact Casts (see emitter.py).
"""
from dyndq.onednn import elementwise, layout, matmul, quantization  # noqa: F401  (each registers its handlers)
from dyndq.onednn.handler import KINDS, Handler, inverse_table

__all__ = ["KINDS", "Handler", "inverse_table"]
