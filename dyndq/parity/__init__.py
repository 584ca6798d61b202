"""Runtime parity: does each engine setting compute what the model means, and if not, which
rewrite or setting, and which node (`dyndq check --runtime-parity`, docs/parity.md).

    check.py         runtime_parity: the comparisons, and the search for causes when one differs
    engines.py       running a setting (ONNX Runtime's levels, OpenVINO's CPU) and the reference
    metrics.py       an output against the reference: max |a - b|, relative, Frobenius, top-1, KL
    bisect.py        which switches make it differ, by halves
    ort_rewrites.py  ONNX Runtime's transformers by name, and what one changed
    divergence.py    the first node whose output differs
    report.py        the report, as text and JSON
    feeds.py         example inputs
"""
from dyndq.parity.check import ENGINES, EngineMissing, runtime_parity
from dyndq.parity.engines import ORT_LEVELS
from dyndq.parity.feeds import OPEN_DIM, ExamplesDoNotFit, example_feeds
from dyndq.parity.metrics import TOLERANCE, OutputParity, compare
from dyndq.parity.report import ParityReport

__all__ = ["ENGINES", "EngineMissing", "ExamplesDoNotFit", "OPEN_DIM", "ORT_LEVELS", "OutputParity", "ParityReport",
           "TOLERANCE", "compare", "example_feeds", "runtime_parity"]
