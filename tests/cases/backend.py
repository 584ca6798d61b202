"""ONNX's own DequantizeLinear backend cases: named cheaply, built once, on first use."""
from __future__ import annotations


def backend_case_names() -> list[str]:
    """The names of ONNX's DequantizeLinear backend test cases, read from the source that
    defines them (building them all takes seconds; collection needs only their names)."""
    import inspect
    import re

    import onnx.backend.test.case.node.dequantizelinear as source

    return sorted(set(re.findall(r'name="(test_dequantizelinear[a-z0-9_]*)"', inspect.getsource(source))))


_BACKEND: dict = {}


def backend_case(name: str):
    """One of ONNX's DequantizeLinear backend cases (all are built on the first call, once per run)."""
    if not _BACKEND:
        import warnings

        from onnx.backend.test.case.node import collect_testcases

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _BACKEND.update({c.name: c for c in collect_testcases("DequantizeLinear")})
    return _BACKEND[name]
