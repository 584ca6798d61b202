"""dyndq.verify on ONNX Runtime's model builder output (onnxruntime_genai.models.builder): a tiny
random Llama, written here with transformers' own classes (no download), built by the builder
twice, `-p fp32` (the source) and `-p int4` (its MatMulNBits, quantized by ONNX Runtime's
MatMulNBitsQuantizer with its default quantizer).  Every quantized weight is matched to its fp32
source and verifies as round to nearest by ONNX Runtime's matmul rule, with no false alarm; a copy
with the nibbles of one weight swapped is named, and only that weight.  Marked `genai`: needs
onnxruntime-genai, torch and transformers (`make test-genai` installs them)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import dyndq

pytestmark = pytest.mark.genai
pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai, torch and transformers: make test-genai")
pytest.importorskip("transformers", reason="needs onnxruntime-genai, torch and transformers: make test-genai")
pytest.importorskip("torch", reason="needs onnxruntime-genai, torch and transformers: make test-genai")

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 64, 128, 2, 96


def tiny_llama(folder, tied: bool = False) -> None:
    """A 2-layer random Llama (hidden 64: two blocks of 32 per row) with a word-level tokenizer, as a
    Hugging Face folder: what the builder reads (it saves the tokenizer beside its model)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tied,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {f"w{i}": i for i in range(4, VOCAB)}
    raw = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(folder)


def build(hf, out, precision: str, *options: str) -> onnx.ModelProto:
    """The builder run as its documentation says (`python -m onnxruntime_genai.models.builder`)."""
    extra = ["--extra_options", *options] if options else []
    run = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
                          "-p", precision, "-e", "cpu", "-c", str(out / "cache"), *extra],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return onnx.load(out / "model.onnx")


# the builder's int4 settings tried (--extra_options): its defaults on cpu (symmetric, block 32,
# accuracy_level 4), and asymmetric codes in blocks of 64 at accuracy_level 1.
SETTINGS = {"default": ((), "symmetric, 4 bits, block 32"),
            "asymmetric": (("is_symmetric=false", "block_size=64", "accuracy_level=1"), "asymmetric, 4 bits, block 64")}
# the embedding quantized too: the op types are separated by "/" (its help's example), a "," names one
# op type "MatMul,Gather" that no node has, which quantizes nothing (as an earlier version of this test found)
GATHER = ("op_types_to_quantize=MatMul/Gather",)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_builder")
    tiny_llama(root / "hf")
    fp32 = build(root / "hf", root / "fp32", "fp32")
    return root, fp32, {name: build(root / "hf", root / name, "int4", *options)
                        for name, (options, _) in {**SETTINGS, "gather": (GATHER, "")}.items()}


def matmulnbits(model):
    return [n for n in model.graph.node if n.op_type == "MatMulNBits"]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_model_builders_int4_verifies_as_onnxruntimes_round_to_nearest(built, setting):
    _, fp32, int4 = built
    nodes = matmulnbits(int4[setting])
    assert len(nodes) == LAYERS * 5 + 1  # (q/k/v fused, o, gate, up, down per layer; lm_head)
    report = dyndq.verify(int4[setting], fp32, outputs=False)
    quantized = [w for w in report.weights if w.status != "float"]
    assert {w.weight for w in quantized} == {n.input[1] for n in nodes}
    assert all(w.source + "_Q4" == w.weight for w in quantized)  # (each matched to its own fp32 weight)
    assert {w.status for w in quantized} == {"rtn"}, [(w.weight, w.status, w.kind) for w in quantized]
    assert {w.rule for w in quantized} == {"ONNX Runtime's matmul rule (MlasQuantizeBlockwise), " + SETTINGS[setting][1]}
    assert all(0.05 < w.error < 0.15 for w in quantized)  # (4-bit round to nearest of random weights)
    assert report.faithful and report.unused == []
    left = [w for w in report.weights if w.status == "float"]
    assert "model.embed_tokens.weight" in {w.weight for w in left} and all(w.error == 0.0 for w in left)


def feed():
    """A prompt of 6 tokens, no past: given, since the past's last dimension is symbolic
    (kv_cache_dim) and verify's seeded samples would give it a size GroupQueryAttention refuses."""
    out = {"input_ids": np.array([[5, 9, 17, 33, 60, 90]], np.int64), "attention_mask": np.ones((1, 6), np.int64)}
    return out | {f"past_key_values.{i}.{k}": np.zeros((1, 2, 0, HIDDEN // 4), np.float32)
                  for i in range(LAYERS) for k in ("key", "value")}


def test_model_builders_outputs_are_compared_on_onnxruntime(built):
    _, fp32, int4 = built
    report = dyndq.verify(int4["default"], fp32, inputs=feed(), engines=["onnxruntime"])
    logits = next(o for o in report.outputs if o.name == "logits")
    assert logits.engine == "onnxruntime" and logits.cosine > 0.98 and logits.kl < 1e-3
    assert report.faithful
    # (the reference engine does not run the builder's contrib ops: said, not a finding)
    assert "reference (our kernel): not compared" in report.outputs_note


def test_nibbles_swapped_in_one_model_builder_weight_is_named_and_only_that(built):
    _, fp32, int4 = built
    bad = onnx.ModelProto()
    bad.CopyFrom(int4["default"])
    name = matmulnbits(bad)[2].input[1]
    t = next(t for t in bad.graph.initializer if t.name == name)
    b = nh.to_array(t)
    t.CopyFrom(nh.from_array(((b >> 4) | (b << 4)).astype(np.uint8), name))
    report = dyndq.verify(bad, fp32, outputs=False)
    found = {w.weight: (w.status, w.kind) for w in report.weights if w.status not in ("rtn", "float")}
    assert found == {name: ("layout", "nibble-order")}
    assert not report.faithful


def test_the_cli_exits_0_on_the_builders_output_and_1_on_the_planted_fault(built):
    root, fp32, int4 = built
    bad = onnx.ModelProto()
    bad.CopyFrom(int4["default"])
    t = next(t for t in bad.graph.initializer if t.name == matmulnbits(bad)[0].input[1])
    b = nh.to_array(t)
    t.CopyFrom(nh.from_array(((b >> 4) | (b << 4)).astype(np.uint8), t.name))
    onnx.save(bad, root / "bad.onnx")
    args = ["--against", str(root / "fp32" / "model.onnx"), "--json", "--weights-only"]
    good = subprocess.run([sys.executable, "-m", "dyndq", "verify", str(root / "default" / "model.onnx"), *args],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert {w["status"] for w in json.loads(good.stdout)["weights"]} <= {"rtn", "float"}
    wrong = subprocess.run([sys.executable, "-m", "dyndq", "verify", str(root / "bad.onnx"), *args],
                           capture_output=True, text=True)
    assert wrong.returncode == 1, wrong.stderr
    assert [w["kind"] for w in json.loads(wrong.stdout)["weights"] if w["status"] == "layout"] == ["nibble-order"]


def test_the_builders_gatherblockquantized_embedding_verifies_as_onnxruntimes_gather_rule(built):
    """op_types_to_quantize=MatMul/Gather: the embedding table becomes GatherBlockQuantized (ONNX
    Runtime's quantizer's quantize_ndarray, blocks of 32 along the hidden axis): rtn under the gather
    rule, the MatMulNBits weights as before, no false alarm; its nibbles swapped are named, only there."""
    _, fp32, int4 = built
    model = int4["gather"]
    [gbq] = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    report = dyndq.verify(model, fp32, outputs=False)
    got = {w.source: w for w in report.weights if w.status != "float"}
    embed = got["model.embed_tokens.weight"]
    assert (embed.weight, embed.status, embed.rule) == (
        gbq.input[0], "rtn", "ONNX Runtime's gather rule (quantize_ndarray), symmetric, 4 bits, block 32")
    assert len(got) == LAYERS * 5 + 2 and {w.status for w in got.values()} == {"rtn"}
    assert report.faithful and report.unused == []
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    t = next(t for t in bad.graph.initializer if t.name == gbq.input[0])
    assert t.data_type == onnx.TensorProto.INT4  # (its codes as int4 [96, 64], one per element: swapped in pairs)
    codes = nh.to_array(t)
    swapped = codes.reshape(codes.shape[0], -1, 2)[..., ::-1].reshape(codes.shape)
    t.CopyFrom(onnx.helper.make_tensor(t.name, t.data_type, t.dims, swapped.reshape(-1).tolist()))
    report = dyndq.verify(bad, fp32, outputs=False)
    assert {w.weight: (w.status, w.kind) for w in report.weights if w.status not in ("rtn", "float")} == {
        gbq.input[0]: ("layout", "nibble-order")}


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """The same tiny Llama with tied embeddings: the builder shares them (shared_embeddings, its default
    for a tied model), fp32 as Gather(Transpose(lm_head's weight)), int4 as GatherBlockQuantized reading
    the lm_head's MatMulNBits codes through a Reshape."""
    root = tmp_path_factory.mktemp("model_builder_tied")
    tiny_llama(root / "hf", tied=True)
    return build(root / "hf", root / "fp32", "fp32"), build(root / "hf", root / "int4", "int4")


def test_the_builders_tied_gatherblockquantized_embedding_verifies(tied):
    fp32, int4 = tied
    [gbq] = [n for n in int4.graph.node if n.op_type == "GatherBlockQuantized"]
    [reshape] = [n for n in int4.graph.node if n.output[0] == gbq.input[0]]
    assert reshape.op_type == "Reshape" and reshape.input[0] == "lm_head.MatMul.weight_Q4"
    assert [n.op_type for n in fp32.graph.node if n.name.startswith("/model/embed_tokens/")][:2] == ["Transpose", "Gather"]
    report = dyndq.verify(int4, fp32, outputs=False)
    got = {w.weight: w for w in report.weights if w.status != "float"}
    assert {w.status for w in got.values()} == {"rtn"} and len(got) == LAYERS * 5 + 2, report.table()
    embed = got[gbq.input[0]]  # (the Reshape's output: the codes folded before the lift)
    assert embed.source == "/model/embed_tokens/Transpose/output_0"  # (the source's view of the lm_head weight)
    assert got["lm_head.MatMul.weight_Q4"].source == "lm_head.MatMul.weight"
    assert report.faithful and report.unused == []
    bad = onnx.ModelProto()
    bad.CopyFrom(int4)
    t = next(t for t in bad.graph.initializer if t.name == "lm_head.MatMul.weight_Q4")
    b = nh.to_array(t)
    t.CopyFrom(nh.from_array(((b >> 4) | (b << 4)).astype(np.uint8), t.name))
    report = dyndq.verify(bad, fp32, outputs=False)  # (the codes both read: a finding on both, nothing else)
    # (the lm_head matched by name: its layout named; the embedding, matched only by closeness, is too far from
    # any source tensor once wrong: unmatched)
    assert {w.weight: (w.status, w.kind) for w in report.weights if w.status not in ("rtn", "float")} == {
        "lm_head.MatMul.weight_Q4": ("layout", "nibble-order"), gbq.input[0]: ("unmatched", None)}
