"""What tests share, imported as `cases` (tests/ is on pytest's pythonpath), one module per concern:

- `table`: the one table of cases every check runs (rows of each op version, `case_model`);
- `checks`: `opcheck` and `opcheck_invalid`, the one runner of the table's rows (tests/test_opcheck.py);
- `oracles`: the independent oracle of the op's arithmetic, and how outputs are compared;
- `models`: small models tests share, `vi`, `run_ort` and `call` (the CLI);
- `backend`: ONNX's own DequantizeLinear backend cases;
- `native`: whether the compiled kernel's tests run;
- `onednn_graphs`: oneDNN graphs written as JSON documents, and the oneDNN tests' small models.

Tests import the names from `cases` itself (`from cases import same_bits`), which holds them all.
"""
from .backend import backend_case, backend_case_names
from .checks import opcheck, opcheck_invalid
from .models import A, B, X, Y, call, dq_input_model, matmul_model, run_ort, sequence_model, vi
from .native import REQUIRE_NATIVE_ENV, budget, native_required, needs_native, why_not_native
from .onednn_graphs import both, graph, hand_model, lt, op, weighted_model
from .oracles import (MATMUL_ATOL, MATMUL_RTOL, along_src, close_after_matmul, oracle, oracle_2, oracle_3,
                      random_array, same_bits, same_values)
from .table import (ALL_CASES, ALL_INVALID, ALL_VALID, CASES, CASES_2, CASES_3, INVALID, INVALID_2, INVALID_3, PC,
                    PG, PT, VALID, VALID_2, VALID_3, Case, bad, case_model, ids)

__all__ = [
    "backend_case", "backend_case_names", "opcheck", "opcheck_invalid", "A", "B", "X", "Y", "call",
    "dq_input_model", "matmul_model", "run_ort", "sequence_model", "vi", "REQUIRE_NATIVE_ENV", "budget",
    "native_required", "needs_native", "why_not_native", "both", "graph", "hand_model", "lt", "op",
    "weighted_model", "MATMUL_ATOL", "MATMUL_RTOL", "along_src", "close_after_matmul", "oracle", "oracle_2",
    "oracle_3", "random_array", "same_bits", "same_values", "ALL_CASES", "ALL_INVALID", "ALL_VALID", "CASES",
    "CASES_2", "CASES_3", "INVALID", "INVALID_2", "INVALID_3", "PC", "PG", "PT", "VALID", "VALID_2",
    "VALID_3", "Case", "bad", "case_model", "ids",
]
