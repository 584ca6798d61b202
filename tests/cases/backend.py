"""ONNX's own DequantizeLinear backend cases: named cheaply, built once, on first use."""
from __future__ import annotations


def backend_case_names() -> list[str]:
    """The names of ONNX's DequantizeLinear backend test cases, read from the source that
    defines them (building them all takes seconds; collection needs only their names)."""
    import inspect
    import re

    import onnx.backend.test.case.node.dequantizelinear as source

    return sorted(set(re.findall(r'name="(test_dequantizelinear[a-z0-9_]*)"', inspect.getsource(source))))


def backend_case(name: str):
    """One of ONNX's DequantizeLinear backend cases, from the one collection of every node test
    (backend_cases.node_cases, built once per run).  Not `collect_testcases("DequantizeLinear")`:
    ONNX's collector filters by op on its first call in a process and imports every generator
    module then, so a later collection of every op would find only DequantizeLinear's cases."""
    from backend_cases import node_cases

    return node_cases()[name]
