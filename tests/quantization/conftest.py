"""The quantizer's tests share models.py, which tests/conftest.py loads as `quantize_models`
(tests/ is not on sys.path: see there)."""
import pytest

from quantize_models import mlp


@pytest.fixture
def model():
    """A float MLP: Gather (embedding), MatMul, Gemm (transB=1), seeded heavy-tailed weights."""
    return mlp()
