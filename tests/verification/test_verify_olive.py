"""dyndq.verify on Olive's ONNX weight quantization (olive-ai 0.13.0, its passes run on an ONNX model
as Olive runs one pass: `create_pass_from_dict(...).run(ONNXModelHandler, out)`).

OnnxBlockWiseRtnQuantization writes MatMulNBits for each MatMul (its codes by ONNX Runtime's own C
quantizer, quantize_matmul_4bits / quantize_matmul_8bits: the matmul rule) and GatherBlockQuantized
for each Gather's table (its codes by its own NumPy `_quantize_ndarray`, blocked along the table's
last axis: ONNX Runtime's quantize_ndarray at 4 bits, step for step; at 8 bits, where ONNX Runtime's
has no form, Olive's own rule, which verify names: codes.rtn_candidates).  Every weight verifies
`rtn` with no false alarm; a planted fault in one weight is named, and only that weight.
OnnxDynamicQuantization (ONNX Runtime's quantize_dynamic, MatMulInteger): its MatMulInteger weights
and the embedding table gathered into one are judged by ONNX Runtime's qdq rule.  Marked `olive`: needs olive-ai (with the torch
it imports): `make test-olive` installs it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import dyndq

pytestmark = pytest.mark.olive
pytest.importorskip("olive.passes.onnx.rtn_quantization", reason="Olive is not installed (an optional extra): "
                    "make test-olive installs it and runs these")

from verify_models import float_model, init, pack, unpack  # noqa: E402


def olive_run(pass_name: str, model: onnx.ModelProto, tmp_path, **config) -> onnx.ModelProto:
    """Olive's pass `pass_name` on `model`, as Olive runs one pass (its model handler, its config
    checked by the pass's own schema)."""
    import importlib

    from olive.model import ONNXModelHandler
    from olive.passes.olive_pass import create_pass_from_dict

    module = {"OnnxBlockWiseRtnQuantization": "olive.passes.onnx.rtn_quantization",
              "OnnxDynamicQuantization": "olive.passes.onnx.quantization"}[pass_name]
    cls = getattr(importlib.import_module(module), pass_name)
    folder = tmp_path / f"{pass_name}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    onnx.save(model, folder / "model.onnx")
    done = create_pass_from_dict(cls, config, disable_search=True).run(
        ONNXModelHandler(model_path=str(folder / "model.onnx")), str(folder / "out"))
    return onnx.load(done.model_path)


def rtn(model, tmp_path, bits: int, symmetric: bool, block: int = 32) -> onnx.ModelProto:
    return olive_run("OnnxBlockWiseRtnQuantization", model, tmp_path, bits=bits, block_size=block,
                     is_symmetric=symmetric)


def source_model(dtype=np.float32) -> onnx.ModelProto:
    """verify_models' float model (E [64, 64] gathered, W1, W2, W3 read by MatMul) with the corner
    cases of a rounding rule: in E's rows (Olive blocks a Gather's table along its last axis) and in
    W2's columns (MatMulNBits blocks along K): a block where |min| = max, values on half levels
    (ties), a block of zeros, a row of zeros, a block holding one positive value; `dtype` float16:
    every weight and the logits in float16 (Olive and ONNX Runtime compute those in float16)."""
    model = float_model()
    e = nh.to_array(init(model, "E")).copy()
    e[0, :32] = np.linspace(-0.25, 0.25, 32)
    e[1, :32] = (np.arange(32) % 16 - 7.5) / 16
    e[1, 0] = -0.5
    e[2, 32:] = 0.0
    e[3, :] = 0.0
    e[4, :32] = 0.0
    e[4, 3] = 0.3
    w2 = nh.to_array(init(model, "W2")).copy()
    w2[:32, 0] = np.linspace(-0.25, 0.25, 32)
    w2[:32, 1] = (np.arange(32) % 16 - 7.5) / 16
    w2[32:, 5] = 0.0
    w2[:, 7] = 0.0
    w2[:32, 9] = 0.0
    w2[3, 9] = 0.3
    for name, value in (("E", e), ("W2", w2), ("W1", nh.to_array(init(model, "W1"))), ("W3", nh.to_array(init(model, "W3")))):
        init(model, name).CopyFrom(nh.from_array(value.astype(dtype), name))
    if dtype == np.float16:
        model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    return model


GATHER_RULE = "ONNX Runtime's gather rule (quantize_ndarray)"
OLIVE_RULE = "Olive's rule (OnnxBlockWiseRtnQuantization._quantize_ndarray)"
MATMUL_RULE = "ONNX Runtime's matmul rule (MlasQuantizeBlockwise)"


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("bits, symmetric", [(4, True), (4, False), (8, True), (8, False)])
def test_olives_block_wise_rtn_verifies_as_round_to_nearest(tmp_path, bits, symmetric, dtype):
    source = source_model(dtype)
    model = rtn(source, tmp_path, bits, symmetric)
    assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"] == \
        ["GatherBlockQuantized", "MatMulNBits", "MatMulNBits", "MatMulNBits"]
    report = dyndq.verify(model, source, samples=2)
    got = {w.source: w for w in report.weights}
    assert {k: (w.status, w.kind) for k, w in got.items()} == {k: ("rtn", None) for k in ("E", "W1", "W2", "W3")}, \
        report.table()
    form = f"{'symmetric' if symmetric else 'asymmetric'}, {bits} bits, block 32"
    # (a Gather's table: ONNX Runtime's quantize_ndarray at 4 bits, which Olive's 4-bit code is; Olive's own at 8,
    # where ONNX Runtime's has no form)
    assert got["E"].rule == f"{GATHER_RULE if bits == 4 else OLIVE_RULE}, {form}"
    assert all(got[w].rule == f"{MATMUL_RULE}, {form}" for w in ("W1", "W2", "W3"))
    assert report.faithful and report.unused == [] and report.settings == []
    assert {o.engine for o in report.outputs} == {"reference", "onnxruntime"}
    assert all(o.cosine > 0.97 and report.within(o) for o in report.outputs), report.outputs
    # (Olive 0.13 renames a quantized MatMul's output, the graph's too: compared by its place, said)
    assert [o.name for o in model.graph.output] == [f"logits_Q{bits}"]
    assert f"the quantized model's output 'logits_Q{bits}' is compared with the source's 'logits'" in report.outputs_note


def test_olives_4_bit_table_is_onnx_runtimes_quantize_ndarray_byte_for_byte(tmp_path):
    """Why a 4-bit table is named ONNX Runtime's rule: ONNX Runtime's own function gives Olive's bytes."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantizer

    source = source_model()
    for symmetric in (True, False):
        model = rtn(source, tmp_path, 4, symmetric)
        codes, scales, zeros = DefaultWeightOnlyQuantizer.quantize_ndarray(nh.to_array(init(source, "E")), 1, 32,
                                                                           symmetric)
        if symmetric:  # (ONNX Runtime's signed codes; GatherBlockQuantized's uint4 is them + 8, as Olive stores them)
            codes = pack(((unpack(codes).astype(np.int16) + 8) & 0xF).astype(np.uint8))
        assert np.array_equal(nh.to_array(init(model, "E_Q4")).reshape(-1), codes.reshape(-1))
        assert np.array_equal(nh.to_array(init(model, "E_scales")).view(np.uint32), scales.view(np.uint32))
        if not symmetric:
            assert np.array_equal(nh.to_array(init(model, "E_zero_point")).reshape(-1), zeros.reshape(-1))


def test_nibbles_swapped_in_olives_table_are_named_and_only_there(tmp_path):
    source = source_model()
    model = rtn(source, tmp_path, 4, True)
    t = init(model, "E_Q4")
    b = nh.to_array(t)
    t.CopyFrom(nh.from_array(((b >> 4) | (b << 4)).astype(np.uint8), t.name))
    report = dyndq.verify(model, source, outputs=False)
    got = {w.source: (w.status, w.kind) for w in report.weights}
    assert got == {"E": ("layout", "nibble-order"), "W1": ("rtn", None), "W2": ("rtn", None), "W3": ("rtn", None)}
    assert not report.faithful


def test_a_zero_point_plus_one_in_olives_8_bit_table_is_named_against_its_rule(tmp_path):
    source = source_model()
    model = rtn(source, tmp_path, 8, False)
    zp = nh.to_array(init(model, "E_zero_point"))
    init(model, "E_zero_point").CopyFrom(nh.from_array(np.where(zp < 255, zp + 1, zp).astype(np.uint8), "E_zero_point"))
    report = dyndq.verify(model, source, outputs=False)
    got = {w.source: w for w in report.weights}
    assert {k: (w.status, w.kind) for k, w in got.items()} == {
        "E": ("layout", "zero-point-off-by-one"), "W1": ("rtn", None), "W2": ("rtn", None), "W3": ("rtn", None)}
    assert got["E"].rule == f"{OLIVE_RULE}, asymmetric, 8 bits, block 32" and "+1" in got["E"].note


def test_the_cli_exits_0_on_olives_output_and_1_on_a_planted_fault(tmp_path, capsys):
    from dyndq.cli import main

    source = source_model()
    model = rtn(source, tmp_path, 4, False)
    onnx.save(source, tmp_path / "source.onnx")
    onnx.save(model, tmp_path / "olive.onnx")
    t = next(t for t in model.graph.initializer if t.name == "W2_Q4")
    b = nh.to_array(t)
    t.CopyFrom(nh.from_array(((b >> 4) | (b << 4)).astype(np.uint8), t.name))
    onnx.save(model, tmp_path / "bad.onnx")
    assert main(["verify", str(tmp_path / "olive.onnx"), "--against", str(tmp_path / "source.onnx"), "--samples", "1"]) == 0
    assert "4 weight(s): 4 rtn; faithful" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "bad.onnx"), "--against", str(tmp_path / "source.onnx"), "--weights-only"]) == 1
    assert "layout       W2_Q4 <- W2  nibble-order" in capsys.readouterr().out


def test_olives_dynamic_quantization_is_judged_rtn(tmp_path):
    """OnnxDynamicQuantization (ONNX Runtime's quantize_dynamic: MatMulInteger): the MatMulInteger
    weights are decoded (their scale where the graph multiplies the int32 product by it) and judged
    rtn, ONNX Runtime's qdq rule, and so is the embedding table gathered straight into the first
    MatMulInteger: no false alarm (before: each unmatched)."""
    source = source_model()
    model = olive_run("OnnxDynamicQuantization", source, tmp_path)
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    report = dyndq.verify(model, source, outputs=False)
    by = {w.weight: w for w in report.weights}
    matmuls = ("W1_quantized", "W2_quantized", "W3_quantized")
    assert [by[n].status for n in matmuls] == ["rtn"] * 3, report.table()
    assert all("quant_utils.quantize_data" in by[n].rule for n in matmuls)
    assert by["E_quantized"].status == "rtn" and "quant_utils.quantize_data" in by["E_quantized"].rule
    assert report.faithful, report.table()


@pytest.fixture(scope="module")
def minilm():
    import trained_models

    if (why := trained_models.minilm_missing()) is not None:
        pytest.skip(why)
    return onnx.load(str(trained_models.path_of("minilm")))


def test_olives_4_bit_minilm_verifies_as_round_to_nearest(minilm, tmp_path):
    """all-MiniLM-L6-v2's export (`make test-trained-export`; DYNDQ_TEST_MODELS points elsewhere):
    Olive's RTN pass at its defaults (symmetric, 4 bits, block 128) writes its 36 MatMul weights as
    MatMulNBits and its embedding tables as GatherBlockQuantized; every one is rtn, the outputs within
    the tolerance on both engines."""
    model = olive_run("OnnxBlockWiseRtnQuantization", minilm, tmp_path)
    report = dyndq.verify(model, minilm, samples=1)
    quantized = [w for w in report.weights if w.status != "float"]
    assert {w.status for w in quantized} == {"rtn"}, [(w.weight, w.status, w.kind) for w in quantized if w.status != "rtn"]
    assert len([n for n in model.graph.node if n.op_type == "MatMulNBits"]) == 36
    assert report.faithful and report.outputs, report.summary()
