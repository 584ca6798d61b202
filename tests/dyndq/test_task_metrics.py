"""dyndq.task_metrics: top-1 agreement and KL divergence, worked by hand for each kind."""
import numpy as np
import pytest

from dyndq.task_metrics import row_sums


def _kl(p, q):
    return float(np.sum(p * np.log(p / q)))


def test_logits_log_distributions_and_distributions_give_one_answer():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    other = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 5.0]])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    q = np.exp(other) / np.exp(other).sum(-1, keepdims=True)
    want = _kl(p[0], q[0]) + _kl(p[1], q[1])
    for kind, a, b in (("logits", logits, other), ("log-distribution", np.log(p), np.log(q)), ("distribution", p, q)):
        agree, rows, kl = row_sums(a, b, kind)
        assert (agree, rows) == (1, 2), kind
        assert kl == pytest.approx(want, rel=1e-9), kind
    assert row_sums(logits, logits, "logits") == (2, 2, 0.0)


def test_a_distribution_with_a_zero_stays_finite():
    # (an engine's zero where the reference has mass: KL against an exact 0 would be infinite)
    agree, rows, kl = row_sums(np.array([0.5, 0.5]), np.array([1.0, 0.0]), "distribution")
    assert (agree, rows) == (1, 1) and np.isfinite(kl) and kl > 10


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind: found 'probabilities'; allowed: logits, log-distribution, distribution"):
        row_sums(np.zeros((1, 2)), np.zeros((1, 2)), "probabilities")


# -- output_kind: the one judge of what an output's last axis holds, for parity and the evaluation ----

def _judged(nodes, outputs, opset=21, shape=(2, 3, 5), names=None):
    """output_kind of each output of a graph of `nodes` over an input x of `shape`, on its values."""
    from onnx import TensorProto, helper

    from dyndq.reference_session import ReferenceSession
    from dyndq.task_metrics import output_kind

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    values = ReferenceSession(model).values({"x": x})
    return [output_kind(model, o, [values[o]]) for o in outputs]


def test_a_log_softmax_over_the_last_axis_is_a_log_distribution():
    """(The evaluation called it logits, parity a log-distribution: the same top-1 and KL up to
    rounding, and a log-distribution is what it is.)"""
    from onnx import helper

    assert _judged([helper.make_node("LogSoftmax", ["x"], ["lp"], axis=-1)], ["lp"]) == ["log-distribution"]


def test_a_value_named_logits_is_logits_whatever_made_it():
    """(Parity took the name at its word; the evaluation asked for a MatMul, Gemm or Add as maker and
    missed a head scaled by a temperature or cast.)"""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", TensorProto.FLOAT, [], [0.7])),
             helper.make_node("Div", ["x", "t"], ["logits"]), helper.make_node("Cast", ["x"], ["next_logits"], to=1)]
    assert _judged(nodes, ["logits", "next_logits"]) == ["logits", "logits"]


def test_a_softmax_over_the_last_axis_however_written_is_a_distribution():
    """(Parity knew axis -1 only: axis 2 of a rank-3 value, or a Softmax behind an Identity, is one
    too; the evaluation saw it in the values.)"""
    from onnx import helper

    nodes = [helper.make_node("Softmax", ["x"], ["p2"], axis=2), helper.make_node("Softmax", ["x"], ["p"]),
             helper.make_node("Identity", ["p"], ["p_id"])]
    assert _judged(nodes, ["p2", "p_id"]) == ["distribution", "distribution"]


def test_a_log_softmax_behind_a_reshape_is_a_log_distribution():
    """(Parity saw no LogSoftmax behind the Reshape; the evaluation called it logits.)"""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("LogSoftmax", ["x"], ["lp"], axis=-1),
             helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", TensorProto.INT64, [2], [-1, 5])),
             helper.make_node("Reshape", ["lp", "s"], ["rows"])]
    assert _judged(nodes, ["rows"]) == ["log-distribution"]


def test_a_softmax_or_log_softmax_over_another_axis_is_neither():
    """Before opset 13 a Softmax's default axis is 1, which flattens every axis from it on: its last
    axis's rows do not sum to 1 (parity called it a distribution); a LogSoftmax over axis 0 makes no
    logits of its last axis (the evaluation called it logits)."""
    from onnx import helper

    assert _judged([helper.make_node("Softmax", ["x"], ["p"])], ["p"], opset=11) == [None]
    assert _judged([helper.make_node("Softmax", ["x"], ["p"])], ["p"], opset=11, shape=(2, 5)) == ["distribution"]
    assert _judged([helper.make_node("LogSoftmax", ["x"], ["lp"], axis=0)], ["lp"]) == [None]


def test_parity_and_the_evaluation_judge_with_the_one_judge():
    """A Softmax over axis 1 of a rank-2 output: parity gives its top-1 agreement now (it gave none),
    and the evaluation measures a LogSoftmax head as a log-distribution (it said logits)."""
    import dyndq
    from onnx import TensorProto, helper

    from quantize_models import mlp

    model = mlp(k=64, n=32)
    model.graph.node.append(helper.make_node("Softmax", ["y"], ["p"], axis=1))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 64]))
    [parity] = dyndq.runtime_parity(model, levels=["basic"], diagnose=False).comparisons[0].outputs
    assert parity.top1_agreement is not None
    model.graph.node[-1].CopyFrom(helper.make_node("LogSoftmax", ["y"], ["p"], axis=-1))
    _, report = dyndq.quantize(model, group_size=32, samples=2)
    assert [(o.name, o.task) for o in report.outputs] == [("p", "log-distribution")]
