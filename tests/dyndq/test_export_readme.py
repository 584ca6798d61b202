"""The README section "Export to standard ONNX" (as given for merging), run as a test."""


def test_readme_export_and_lift_example():
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import dyndq

    # y = MatMul(x, DynamicDequantize(w_q, scales, zps)): int8 weights, one scale and
    # one int8 zero point per output column (per_channel along axis 1).
    rng = np.random.default_rng(0)
    w_q = rng.integers(-128, 128, (4, 3), dtype=np.int8)
    scales = np.array([0.02, 0.5, 1.25], np.float32)
    zps = np.array([0, -3, 7], np.int8)
    graph = helper.make_graph(
        [
            dyndq.make_node(["w_q", "scales", "zps"], ["w"], qtype="per_channel", axis=1, name="w_dq"),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3])],
        initializer=[numpy_helper.from_array(a, n) for a, n in ((w_q, "w_q"), (scales, "scales"), (zps, "zps"))],
    )
    model = dyndq.make_model(graph, opset=11)

    exported, report = dyndq.export_with_report(model)
    print(report.summary())
    # lowered 1 DynamicDequantize node(s); ai.onnx opset 13 (converted from 11), IR version 7
    onnx.checker.check_model(exported, full_check=True)
    assert [n.op_type for n in exported.graph.node] == ["DequantizeLinear", "MatMul"]
    assert dyndq.DOMAIN not in {o.domain for o in exported.opset_import}

    x = rng.standard_normal((2, 4)).astype(np.float32)
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    y, w = session.run(None, {"x": x})
    assert np.array_equal(w, dyndq.dynamic_dequantize(w_q, scales, zps, qtype="per_channel", axis=1))  # to the bit

    # Lifting: the exported DequantizeLinear becomes DynamicDequantize again.
    lifted, lift_report = dyndq.lift_with_report(exported)
    print(lift_report.summary())
    # lifted 1 DequantizeLinear node(s); left 0 alone
    assert lifted.graph.node[0].op_type == "DynamicDequantize"
