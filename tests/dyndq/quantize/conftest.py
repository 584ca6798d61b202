"""The quantizer's tests share models.py, loaded by file as `quantize_models` (tests/ is not
on sys.path: see tests/conftest.py)."""
import importlib.util
import os
import sys

if "quantize_models" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("quantize_models", os.path.join(os.path.dirname(__file__), "models.py"))
    sys.modules["quantize_models"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["quantize_models"])


import pytest  # noqa: E402


@pytest.fixture
def model():
    """A float MLP: Gather (embedding), MatMul, Gemm (transB=1), seeded heavy-tailed weights."""
    return sys.modules["quantize_models"].mlp()
