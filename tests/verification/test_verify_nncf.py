"""dyndq.verify on NNCF's ONNX weight compression (nncf.compress_weights, its data-free modes: INT4_SYM
and INT4_ASYM in groups, INT8_ASYM and INT8_SYM per channel; NNCF 3.4): every weight verifies `rtn`,
no false layout alarm, and NNCF's own rule (codes.nncf_candidates, written out in NumPy) is checked
here against NNCF's real output.  On float32 weights NNCF's codes are ONNX Runtime's gather rule's
(quantize_ndarray: w / scale, NumPy's half-to-even rounding, the same symmetric scale) but for one
thing here: a scale below float32's eps is eps in NNCF's, 0 in ONNX Runtime's (and a group of one positive
value, not made here, takes a positive symmetric scale in NNCF's, a negative one in ONNX Runtime's); so a weight with a group
of zeros (a pruned column) is NNCF's rule alone, and the others are ONNX Runtime's rules with a note
that NNCF's gives the same codes.  A copy with nibbles swapped in one weight, and one with one
weight's zero points plus one, are each named, and only that weight.  The weights stay below NNCF's
10000 elements, where it would take OpenVINO's compiled compression (when OpenVINO is installed)
instead of its NumPy reference (the path checked here)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import dyndq

pytestmark = pytest.mark.nncf
nncf = pytest.importorskip("nncf", reason="NNCF is not installed (an optional extra): make test-nncf installs it "
                           "and runs these")
from nncf import CompressWeightsMode as Mode  # noqa: E402

from verify_models import copy_of, float_model, init, replace  # noqa: E402

NNCF_RULE = "NNCF's rule (weight_lowering.do_integer_quantization)"
ALSO = "NNCF's rule (weight_lowering.do_integer_quantization)"  # (a weight's `also`: said once per report)


def source_model(opset: int = 21) -> onnx.ModelProto:
    """verify_models' float model with W2 [64, 128] holding NNCF's corner cases: a group where |min|
    equals max (col 0: the symmetric scale's sign), values on half levels (col 1: ties), a group of
    zeros (col 5, rows 32..63) and a column of zeros (col 7: a pruned output)."""
    model = float_model()
    w2 = nh.to_array(init(model, "W2")).copy()
    w2[:32, 0] = np.linspace(-0.25, 0.25, 32, dtype=np.float32)
    w2[:32, 1] = (np.arange(32) % 16 - 7.5).astype(np.float32) / 16
    w2[0, 1] = -0.5
    w2[32:, 5] = 0.0
    w2[:, 7] = 0.0
    replace(model, "W2", w2)
    if opset != 21:  # (below 21 NNCF writes MatMulNBits for a grouped MatMul weight)
        model.opset_import[0].version, model.ir_version = opset, 9
    return model


def compressed(model, mode, group_size=None) -> onnx.ModelProto:
    kw = {} if group_size is None else {"group_size": group_size, "ratio": 1.0}
    return nncf.compress_weights(copy_of(model), mode=mode, **kw)


MODES = [(Mode.INT4_SYM, 32, "symmetric, 4 bits, block 32"), (Mode.INT4_ASYM, 32, "asymmetric, 4 bits, block 32"),
         (Mode.INT4_ASYM, 64, "asymmetric, 4 bits, block 64"), (Mode.INT8_ASYM, None, "asymmetric, 8 bits, per channel"),
         (Mode.INT8_SYM, None, "symmetric, 8 bits, per channel")]


@pytest.mark.parametrize("mode, group_size, form", MODES, ids=lambda v: str(v))
def test_nncfs_compression_verifies_as_round_to_nearest(mode, group_size, form):
    source = source_model()
    model = compressed(source, mode, group_size)
    assert {n.op_type for n in model.graph.node} >= {"DequantizeLinear", "MatMul", "Gather"}
    report = dyndq.verify(model, source, samples=2)
    got = {w.source: w for w in report.weights}
    assert {k: (w.status, w.kind) for k, w in got.items()} == {k: ("rtn", None) for k in ("E", "W1", "W2", "W3")}
    assert report.faithful and report.unused == []
    assert got["W2"].rule == f"{NNCF_RULE}, {form}"  # (its zero groups: NNCF's eps scale, no rule of ONNX Runtime's)
    assert got["W1"].rule.endswith(form) and got["W1"].also == ALSO
    # INT4 modes keep the embedding and the last MatMul in NNCF's backup mode, INT8_ASYM per channel
    backup = form if group_size is None else "asymmetric, 8 bits, per channel"
    assert got["E"].rule.endswith(backup) and got["W3"].rule.endswith(backup) and got["E"].also == ALSO
    assert len(report.outputs) == 2 and all(o.cosine > 0.99 for o in report.outputs), report.outputs  # (both engines)


def test_without_the_zero_groups_nncfs_codes_are_onnx_runtimes_gather_rule():
    """W2 with its zero groups filled: no weight is NNCF's rule alone; W2 (ties and the |min| = max
    group) is ONNX Runtime's gather rule, not its matmul rule, whose roundf and sign differ there."""
    source = source_model()
    w2 = nh.to_array(init(source, "W2")).copy()
    rng = np.random.default_rng(5)
    w2[32:, 5], w2[:, 7] = rng.standard_normal(32) * 0.1, rng.standard_normal(64) * 0.1
    replace(source, "W2", w2)
    report = dyndq.verify(compressed(source, Mode.INT4_SYM, 32), source, outputs=False)
    got = {w.source: w for w in report.weights}
    assert {w.status for w in report.weights} == {"rtn"}
    assert got["W2"].rule == "ONNX Runtime's gather rule (quantize_ndarray), symmetric, 4 bits, block 32"
    assert all(w.also == ALSO and w.note == "" for w in report.weights)
    assert report.also == [{"rule": ALSO, "weights": [w.weight for w in report.weights]}]
    said = [line for line in report.table() if "gives the same codes" in line]
    assert said == [f"  {ALSO} gives the same codes as the rule named for every rtn weight (4)"]  # (once)


def test_nncfs_matmulnbits_form_below_opset_21_verifies():
    """Opset 19: NNCF writes com.microsoft.MatMulNBits for the grouped weights (its signed codes + 8)."""
    source = source_model(opset=19)
    model = compressed(source, Mode.INT4_SYM, 32)
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 2
    report = dyndq.verify(model, source, samples=2)
    got = {w.source: w for w in report.weights}
    assert {k: w.status for k, w in got.items()} == {k: "rtn" for k in ("E", "W1", "W2", "W3")}
    assert got["W2"].rule == f"{NNCF_RULE}, symmetric, 4 bits, block 32" and report.faithful


def _int4(model, name) -> np.ndarray:
    return nh.to_array(init(model, name)).astype(np.int64)


def _store(model, name, values) -> None:
    t = init(model, name)
    t.CopyFrom(onnx.helper.make_tensor(name, t.data_type, t.dims, values.reshape(-1).tolist()))


def test_nibbles_swapped_in_one_weight_are_named_and_only_there():
    source = source_model()
    model = compressed(source, Mode.INT4_SYM, 32)
    codes = _int4(model, "W1_quantized")  # (int4 [64, 64]: storage order is row-major, pairs along N)
    _store(model, "W1_quantized", codes.reshape(-1, 2)[:, ::-1].reshape(codes.shape))
    report = dyndq.verify(model, source, outputs=False)
    got = {w.source: (w.status, w.kind) for w in report.weights}
    assert got == {"E": ("rtn", None), "W1": ("layout", "nibble-order"), "W2": ("rtn", None), "W3": ("rtn", None)}
    assert not report.faithful


def test_a_zero_point_plus_one_in_one_weight_is_named_and_only_there():
    source = source_model()
    model = compressed(source, Mode.INT4_ASYM, 32)
    zp = _int4(model, "W2_zero_point")
    _store(model, "W2_zero_point", np.where(zp < 15, zp + 1, zp))
    report = dyndq.verify(model, source, outputs=False)
    got = {w.source: w for w in report.weights}
    assert {k: (w.status, w.kind) for k, w in got.items()} == {
        "E": ("rtn", None), "W1": ("rtn", None), "W2": ("layout", "zero-point-off-by-one"), "W3": ("rtn", None)}
    assert got["W2"].rule.startswith(NNCF_RULE) and "+1" in got["W2"].note


def test_nncfs_invalid_embedding_with_all_layers_is_said_against_its_weight():
    """all_layers=True with groups: NNCF 3.4 blocks the Gather's table [64, 64] along axis 0 with its
    scales [64, 2] grouped along axis 1, a DequantizeLinear neither engine runs.  verify says so against
    that weight (unmatched, the engine's complaint in its note), not an internal error, and judges the rest."""
    source = source_model()
    model = nncf.compress_weights(copy_of(source), mode=Mode.INT4_SYM, group_size=32, ratio=1.0, all_layers=True)
    report = dyndq.verify(model, source, samples=1)
    got = {w.weight: w for w in report.weights}
    assert {k: (w.status, w.source) for k, w in got.items()} == {
        "E_dequantized": ("unmatched", None), "W1_dequantized": ("rtn", "W1"), "W2_dequantized": ("rtn", "W2"),
        "W3_dequantized": ("rtn", "W3")}
    assert "DequantizeLinear 'E_DequantizeLinear'" in got["E_dequantized"].note
    assert "does not compute on the reference engine: Invalid shapes for Blocked Quantization" in got["E_dequantized"].note
    assert report.unused == ["E"] and not report.faithful and report.outputs == []


def test_nncfs_asymmetric_matmulnbits_is_a_finding_not_a_float_weight():
    """Opset 19, INT4_ASYM: NNCF 3.4 writes MatMulNBits' zero points unpacked, uint8 [N, blocks], a shape
    neither ONNX Runtime (its PrePack refuses it) nor dyndq's lift takes.  Its scales were once listed
    as weights left float, and the report faithful (exit 0); now each is unmatched, a finding."""
    source = source_model(opset=19)
    model = compressed(source, Mode.INT4_ASYM, 32)
    zp = next(t for t in model.graph.initializer if t.name == "W1_zero_point")
    assert list(zp.dims) == [64, 2]  # (NNCF's form, as it writes it)
    report = dyndq.verify(model, source, samples=1)
    got = {w.weight: (w.status, w.source) for w in report.weights}
    assert got == {"E_dequantized": ("rtn", "E"), "W3_dequantized": ("rtn", "W3"),
                   "W1_scale": ("unmatched", None), "W2_scale": ("unmatched", None)}
    assert all("MatMulNBits node verify could not read" in w.note for w in report.weights if w.status == "unmatched")
    assert sorted(report.unused) == ["W1", "W2"] and not report.faithful
