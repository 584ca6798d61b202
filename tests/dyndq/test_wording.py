"""The message helpers of dyndq.wording."""
from dyndq.wording import cut, engine_error


def test_cut_keeps_short_names_whole_and_cuts_long_ones_saying_their_length():
    assert cut("fc_gate") == "fc_gate" and cut("x" * 80) == "x" * 80
    long = "a" * 1000 + "END"
    shown = cut(long)
    assert len(shown) < 100 and shown.startswith("aaaa") and "END (1,003 characters)" in shown
    assert cut(12345) == "12345" and len(cut("b" * 500, limit=200)) < 250


def test_engine_error_keeps_what_failed_and_drops_the_engines_frames():
    ort = RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model failed: no such op\n")
    assert engine_error(ort) == "Load model failed: no such op"
    openvino = RuntimeError("Exception from src/inference/src/cpp/core.cpp:112:\n"
                            "Check 'false' failed at src/frontends/onnx/frontend/src/frontend.cpp:120:\n"
                            "FrontEnd API failed with GeneralFailure:\n"
                            "OpenVINO does not support the following ONNX operations: acme.Quarter\n")
    assert engine_error(openvino) == "OpenVINO does not support the following ONNX operations: acme.Quarter"
    assert engine_error(RuntimeError("")) == "RuntimeError" and engine_error(ValueError("  one  ")) == "one"
