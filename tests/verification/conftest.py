"""The float model of tests/verify_models.py and ONNX Runtime's 4-bit MatMulNBits quantization of it,
made once for each module of verify's tests that asks (test_verify.py, test_blame.py)."""
from __future__ import annotations

import pytest

from verify_models import float_model, nbits


@pytest.fixture(scope="module")
def source():
    return float_model()


@pytest.fixture(scope="module")
def quantized(source):
    return nbits(source)  # (needs onnxruntime.quantization: the modules asking skip without it)
