"""dyndq.import_weights of a mixture of experts: GGUF files gguf's own writer made, each layer's
experts stacked into one 3-D tensor as llama.cpp's converter writes them (`blk.0.ffn_gate_exps.weight`
[E, I, H], `ffn_up_exps`, `ffn_down_exps` [E, H, I]), put onto drawn float models of both forms an
export holds: per-expert 2-D weights (transformers 4's Mixtral, `...experts.3.w1.weight`, read by
torch's Transpose+MatMul or stored [in, out] for MatMul), and 3-D weights (transformers 5's fused
`mlp.experts.gate_up_proj` [E, 2I, H] and `down_proj`, read by a Gather of the expert, or [E, H, 2I]
by a batched MatMul).  Each weight equals gguf's dequantization bit for bit (its expert's slice; gate
and up joined, gate first) on the reference engine and ONNX Runtime; the outputs equal the float model
holding those weights; the experts no weight took are listed unused; a fused gate_up the name map does
not know is refused naming both halves; per-expert safetensors modules match by name."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from engines import run_onnxruntime
from gguf_blocks import gguf, qtype, write_gguf
from gguf_models import bits

E, H, I, T = 4, 256, 512, 3
ROUTER = "model.layers.0.block_sparse_moe.gate.weight"
GATE_UP, DOWN_3D = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"


def expert_name(e: int, w: str) -> str:  # transformers 4's Mixtral: w1 gate, w3 up, w2 down
    return f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"


def blocks(kind: str, shape, seed: int) -> np.ndarray:
    """A tensor of `shape` (NumPy's, the row last) in GGUF type `kind`: gguf's own quantizer where it
    has one (Q4_0, Q8_0), raw blocks with small float16 d and dmin for a K-quant (it has none)."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    try:
        return gguf.quants.quantize(values, qtype(kind))
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[qtype(kind)]
        data = rng.integers(0, 256, (*shape[:-1], shape[-1] // block, size), dtype=np.uint8)
        data[..., 0:4] = np.array([2e-4, 1e-4], np.float16).view(np.uint8)
        return data.reshape(*shape[:-1], -1)


def dequantized(kind: str, data: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(data, qtype(kind)).astype(np.float32, copy=False)


TYPES = [("Q4_K", "Q8_0", "Q4_0"), ("Q8_0", "Q4_0", "Q4_K")]  # (gate, up, down): each type on each role once at least


def fused_architecture() -> str:
    """qwen3next, whose gguf name map knows transformers 5's fused gate_up (FFN_GATE_UP_EXP, in
    gguf 0.19); the test skipped, saying so, where the installed gguf's does not."""
    tensor = getattr(gguf.MODEL_TENSOR, "FFN_GATE_UP_EXP", None)
    arch = getattr(gguf.MODEL_ARCH, "QWEN3NEXT", None)
    if tensor is None or arch is None or tensor not in gguf.MODEL_TENSORS.get(arch, ()):
        pytest.skip("the installed gguf's name map of qwen3next knows no fused gate_up (gguf 0.19 does)")
    return gguf.MODEL_ARCH_NAMES[arch]


def moe_file(path, types, architecture: str) -> dict:
    """A GGUF of one layer's stacked experts (and the router, F32); returns {tensor: (kind, bytes)}."""
    gate, up, down = types
    tensors = {"blk.0.ffn_gate_inp.weight": ("F32", (np.random.default_rng(9).standard_normal((E, H)) * 0.1)
                                             .astype(np.float32)),
               "blk.0.ffn_gate_exps.weight": (gate, blocks(gate, (E, I, H), 1)),
               "blk.0.ffn_up_exps.weight": (up, blocks(up, (E, I, H), 2)),
               "blk.0.ffn_down_exps.weight": (down, blocks(down, (E, H, I), 3))}
    write_gguf(path, tensors, architecture, block_count=1)
    return tensors


def experts_of(tensors: dict) -> dict[str, np.ndarray]:
    """gguf's dequantization of the three stacked tensors: {"gate", "up", "down"} -> [E, rows, row]."""
    return {k: dequantized(*tensors[f"blk.0.ffn_{k}_exps.weight"]) for k in ("gate", "up", "down")}


def _model(nodes, inits, outputs) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, H])
    graph = helper.make_graph(nodes, "moe", [x], outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def per_expert_model(w: dict, experts=range(E)) -> onnx.ModelProto:
    """Mixtral as transformers 4 holds it, a dense mixture (every expert, weighed by the router's
    softmax): even experts' weights [out, in] read by Transpose+MatMul (torch's export), odd ones
    stored [in, out] for MatMul."""
    nodes = [helper.make_node("Transpose", [ROUTER], ["routerT"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "routerT"], ["router_logits"]),
             helper.make_node("Softmax", ["router_logits"], ["p"], axis=-1)]
    inits = [numpy_helper.from_array(w["router"], ROUTER), numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    ys = []
    for e in experts:
        read = {}
        for part, key in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            name = expert_name(e, part)
            if e % 2 == 0:
                inits.append(numpy_helper.from_array(w[key][e], name))
                nodes.append(helper.make_node("Transpose", [name], [f"{name}_T"], perm=[1, 0]))
                read[key] = f"{name}_T"
            else:
                inits.append(numpy_helper.from_array(np.ascontiguousarray(w[key][e].T), name))
                read[key] = name
        nodes += [helper.make_node("MatMul", ["x", read["gate"]], [f"g{e}"]),
                  helper.make_node("MatMul", ["x", read["up"]], [f"u{e}"]),
                  helper.make_node("Mul", [f"g{e}", f"u{e}"], [f"a{e}"]),
                  helper.make_node("MatMul", [f"a{e}", read["down"]], [f"y{e}"]),
                  helper.make_node("Gather", ["p", f"e{e}"], [f"p{e}"], axis=1),
                  helper.make_node("Unsqueeze", [f"p{e}", "axis1"], [f"p{e}_"]),
                  helper.make_node("Mul", [f"y{e}", f"p{e}_"], [f"py{e}"])]
        inits.append(numpy_helper.from_array(np.array(e, np.int64), f"e{e}"))
        ys.append(f"py{e}")
    nodes.append(helper.make_node("Sum", ys, ["y"]))
    return _model(nodes, inits, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, H])])


def fused_model(w: dict, batched: bool) -> onnx.ModelProto:
    """transformers 5's fused experts: gate_up [E, 2I, H] (gate first) and down [E, H, I], each expert
    taken by Gather and read through Transpose+MatMul; or (`batched`) stored [E, H, 2I] and [E, I, H]
    and read by one batched MatMul each."""
    gate_up = np.concatenate([w["gate"], w["up"]], axis=1)
    down = w["down"]
    inits = [numpy_helper.from_array(np.array([I, I], np.int64), "halves"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    if batched:
        inits += [numpy_helper.from_array(np.ascontiguousarray(gate_up.transpose(0, 2, 1)), GATE_UP),
                  numpy_helper.from_array(np.ascontiguousarray(down.transpose(0, 2, 1)), DOWN_3D)]
        nodes = [helper.make_node("MatMul", ["x", GATE_UP], ["gu"]),  # [E, T, 2I]
                 helper.make_node("Split", ["gu", "halves"], ["g", "u"], axis=-1),
                 helper.make_node("Mul", ["g", "u"], ["a"]),
                 helper.make_node("MatMul", ["a", DOWN_3D], ["ye"]),  # [E, T, H]
                 helper.make_node("ReduceSum", ["ye", "axis0"], ["y"], keepdims=0)]
    else:
        inits += [numpy_helper.from_array(gate_up, GATE_UP), numpy_helper.from_array(down, DOWN_3D)]
        nodes, ys = [], []
        for e in range(E):
            inits.append(numpy_helper.from_array(np.array(e, np.int64), f"e{e}"))
            nodes += [helper.make_node("Gather", [GATE_UP, f"e{e}"], [f"gu{e}_w"], axis=0),
                      helper.make_node("Transpose", [f"gu{e}_w"], [f"gu{e}_wT"], perm=[1, 0]),
                      helper.make_node("MatMul", ["x", f"gu{e}_wT"], [f"gu{e}"]),
                      helper.make_node("Split", [f"gu{e}", "halves"], [f"g{e}", f"u{e}"], axis=-1),
                      helper.make_node("Mul", [f"g{e}", f"u{e}"], [f"a{e}"]),
                      helper.make_node("Gather", [DOWN_3D, f"e{e}"], [f"d{e}_w"], axis=0),
                      helper.make_node("Transpose", [f"d{e}_w"], [f"d{e}_wT"], perm=[1, 0]),
                      helper.make_node("MatMul", [f"a{e}", f"d{e}_wT"], [f"y{e}"])]
            ys.append(f"y{e}")
        nodes.append(helper.make_node("Sum", ys, ["y"]))
    return _model(nodes, inits, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, H])])


def source(seed: int = 5) -> dict:
    """Float weights of the drawn MoE (the float model's own, which the checkpoint stands for)."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
    return {"router": w(E, H), "gate": w(E, I, H), "up": w(E, I, H), "down": w(E, H, I)}


def with_weights(model: onnx.ModelProto, weights: dict) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.name in weights:
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(weights[t.name]), t.name))
    return out


def renamed(model: onnx.ModelProto, names: dict) -> None:
    """The model's initializers `names` gives renamed in place, and their readers' inputs with them."""
    for t in model.graph.initializer:
        t.name = names.get(t.name, t.name)
    for n in model.graph.node:
        n.input[:] = [names.get(i, i) for i in n.input]


def check_weights_and_outputs(out: onnx.ModelProto, float_model: onnx.ModelProto, want: dict) -> None:
    """Each imported weight bit for bit `want` on both engines; the outputs those of the float model
    holding `want` (the reference engine: the same bits; ONNX Runtime: its MatMul's order, a tolerance)."""
    assert dyndq.check(out) == []
    probe = onnx.ModelProto()
    probe.CopyFrom(out)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in want.items())
    names = [o.name for o in probe.graph.output]
    x = {"x": np.random.default_rng(7).standard_normal((T, H)).astype(np.float32)}
    got = {"reference": dyndq.run(probe, x),
           "onnxruntime": dict(zip(names, run_onnxruntime(dyndq.export(probe, target="onnxruntime"), x)))}
    for engine, values in got.items():
        for name, value in want.items():
            assert values[name].shape == value.shape, (engine, name, values[name].shape)
            assert (bits(values[name]) == bits(value)).all(), f"{name} on {engine}"
    oracle = dyndq.run(with_weights(float_model, want), x)["y"]
    assert (bits(got["reference"]["y"]) == bits(oracle)).all()
    np.testing.assert_allclose(got["onnxruntime"]["y"], oracle, rtol=1e-4, atol=1e-5 * float(np.abs(oracle).max()))


@pytest.mark.parametrize("types", TYPES, ids="-".join)
def test_per_expert_weights_take_their_experts_slice_of_the_stacked_tensor(tmp_path, types):
    tensors = moe_file(tmp_path / "moe.gguf", types, "llama")  # (Mixtral: llama.cpp writes it as llama)
    model = per_expert_model(source())
    out, report = dyndq.import_weights(model, tmp_path / "moe.gguf")
    deq = experts_of(tensors)
    want = {ROUTER: dequantized(*tensors["blk.0.ffn_gate_inp.weight"])}
    for e in range(E):
        for part, key in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            want[expert_name(e, part)] = deq[key][e] if e % 2 == 0 else np.ascontiguousarray(deq[key][e].T)
    check_weights_and_outputs(out, model, want)
    rows = {r.weight: r for r in report.imported}
    assert set(rows) == set(want) and report.left_float == [] and report.unused == []
    row = rows[expert_name(3, "w2")]
    assert (row.tensor, row.how, row.orientation, row.shape) == (
        "blk.0.ffn_down_exps.weight[3]", "by GGUF's name map, expert 3", "transposed", (H, I))
    assert "expert 3 of blk.0.ffn_down_exps.weight's 4" in row.note
    # each expert's slice decoded alone: its codes in the file once, the file no larger than the checkpoint's bytes
    quantized = sum(d.nbytes for _, d in tensors.values())
    written = sum(len(t.raw_data) for t in out.graph.initializer)
    assert written <= 1.10 * quantized, written / quantized


def test_experts_no_weight_takes_are_listed_unused_one_by_one(tmp_path):
    tensors = moe_file(tmp_path / "moe.gguf", TYPES[0], "llama")
    model = per_expert_model(source(), experts=[0, 2])
    out, report = dyndq.import_weights(model, tmp_path / "moe.gguf")
    unused = [name for name, *_ in report.unused]
    assert unused == [f"blk.0.ffn_{k}_exps.weight[{e}]" for k in ("gate", "up", "down") for e in (1, 3)]
    assert {shape for _, _, shape in report.unused} == {(I, H), (H, I)}
    deq = experts_of(tensors)
    want = {expert_name(e, p): deq[k][e] for e in (0, 2) for p, k in (("w1", "gate"), ("w3", "up"), ("w2", "down"))}
    check_weights_and_outputs(out, model, {**want, ROUTER: dequantized(*tensors["blk.0.ffn_gate_inp.weight"])})


@pytest.mark.parametrize("batched", [False, True], ids=["gather", "batched"])
@pytest.mark.parametrize("types", TYPES, ids="-".join)
def test_fused_3d_weights_take_the_stacked_tensors_gate_and_up_joined(tmp_path, types, batched):
    # qwen3next: gguf's name map knows transformers 5's fused gate_up (FFN_GATE_UP_EXP) for it; the file
    # holds gate and up apart, as llama.cpp's converter writes them from per-expert weights
    tensors = moe_file(tmp_path / "moe.gguf", types, fused_architecture())
    model = fused_model(source(), batched)
    out, report = dyndq.import_weights(model, tmp_path / "moe.gguf")
    deq = experts_of(tensors)
    gate_up, down = np.concatenate([deq["gate"], deq["up"]], axis=1), deq["down"]
    if batched:
        gate_up, down = (np.ascontiguousarray(a.transpose(0, 2, 1)) for a in (gate_up, down))
    check_weights_and_outputs(out, model, {GATE_UP: gate_up, DOWN_3D: down})
    rows = {r.weight: r for r in report.imported}
    assert rows[GATE_UP].tensor == "blk.0.ffn_gate_exps.weight+blk.0.ffn_up_exps.weight"
    assert rows[GATE_UP].how == "by GGUF's name map, gate and up joined"
    assert rows[DOWN_3D].tensor == "blk.0.ffn_down_exps.weight" and rows[DOWN_3D].how == "by GGUF's name map"
    assert {r.orientation for r in rows.values()} == {"transposed" if batched else "as stored"}
    assert [name for name, *_ in report.unused] == ["blk.0.ffn_gate_inp.weight"]
    quantized = sum(d.nbytes for k, (_, d) in tensors.items() if "exps" in k)
    assert sum(len(t.raw_data) for t in out.graph.initializer) <= 1.10 * quantized


def test_a_fused_gate_up_the_name_map_does_not_know_is_refused_naming_both(tmp_path):
    moe_file(tmp_path / "moe.gguf", TYPES[0], "llama")  # (Mixtral: llama's map knows no fused gate_up)
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.import_weights(fused_model(source(), False), tmp_path / "moe.gguf")
    message = str(e.value)
    assert GATE_UP in message and "'blk.0.ffn_gate_exps.weight'" in message and "'blk.0.ffn_up_exps.weight'" in message
    assert "knows no fused gate_up" in message


def test_a_3d_weight_without_names_matches_by_shape_either_way_round(tmp_path):
    tensors = moe_file(tmp_path / "moe.gguf", TYPES[1], "llama")
    w = source()
    deq = experts_of(tensors)
    w["down"] = deq["down"] + np.float32(0.001)  # (the float model is the checkpoint's source: close to it)
    model = fused_model(w, batched=True)
    renamed(model, {DOWN_3D: "onnx::MatMul_down", GATE_UP: "onnx::MatMul_gate_up"})  # (names no map knows)
    out, report = dyndq.import_weights(model, tmp_path / "moe.gguf")
    rows = {r.weight: r for r in report.imported}
    assert list(rows) == ["onnx::MatMul_down"]  # (no tensor has gate_up's shape; gate and up [E, I, H] are far from down)
    assert report.left_float == [("onnx::MatMul_gate_up", (E, H, 2 * I))]
    row = rows["onnx::MatMul_down"]
    assert (row.tensor, row.how, row.orientation) == ("blk.0.ffn_down_exps.weight", "by shape", "transposed")
    assert row.error < 0.1
    check_weights_and_outputs(out, model, {"onnx::MatMul_down": np.ascontiguousarray(deq["down"].transpose(0, 2, 1))})


def test_per_expert_weights_without_names_match_their_experts_slice_by_shape(tmp_path):
    tensors = moe_file(tmp_path / "moe.gguf", TYPES[0], "llama")
    deq = experts_of(tensors)
    rng = np.random.default_rng(11)
    # the float model is the checkpoint's source: close to its dequantized experts, under names no map knows
    near = {k: (v + rng.standard_normal(v.shape).astype(np.float32) * 0.002).astype(np.float32) for k, v in deq.items()}
    model = per_expert_model({**source(), **near})
    names = {expert_name(e, p): f"onnx::MatMul_{e}_{p}" for e in range(E) for p in ("w1", "w3", "w2")}
    renamed(model, names)
    out, report = dyndq.import_weights(model, tmp_path / "moe.gguf")
    rows = {r.weight: r for r in report.imported}
    want = {ROUTER: dequantized(*tensors["blk.0.ffn_gate_inp.weight"])}
    for e in range(E):
        for p, k in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            row = rows[names[expert_name(e, p)]]
            assert (row.tensor, row.how) == (f"blk.0.ffn_{k}_exps.weight[{e}]", "by shape") and row.error < 0.2, row
            want[row.weight] = deq[k][e] if e % 2 == 0 else np.ascontiguousarray(deq[k][e].T)
    assert report.unused == [] and report.left_float == []
    check_weights_and_outputs(out, model, want)


def test_names_map_takes_an_experts_slice(tmp_path):
    tensors = moe_file(tmp_path / "moe.gguf", TYPES[0], "llama")
    model = per_expert_model(source(), experts=[0])
    renamed(model, {expert_name(0, "w1"): "custom_gate"})
    out, report = dyndq.import_weights(model, tmp_path / "moe.gguf", names={"blk.0.ffn_gate_exps.weight[2]": "custom_gate"})
    row = next(r for r in report.imported if r.weight == "custom_gate")
    assert (row.tensor, row.how) == ("blk.0.ffn_gate_exps.weight[2]", "by --names")
    assert "blk.0.ffn_gate_exps.weight[2]" not in [n for n, *_ in report.unused]
    assert "blk.0.ffn_gate_exps.weight[0]" in [n for n, *_ in report.unused]
    deq = experts_of(tensors)
    check_weights_and_outputs(out, model, {"custom_gate": deq["gate"][2], expert_name(0, "w3"): deq["up"][0],
                                           expert_name(0, "w2"): deq["down"][0],
                                           ROUTER: dequantized(*tensors["blk.0.ffn_gate_inp.weight"])})


def test_onnxruntime_emit_fuses_each_experts_slice_and_composes_the_3d_weights(tmp_path):
    tensors = moe_file(tmp_path / "moe.gguf", ("Q4_0", "Q8_0", "Q4_0"), fused_architecture())
    deq = experts_of(tensors)
    x = {"x": np.random.default_rng(7).standard_normal((T, H)).astype(np.float32)}
    for model, want in ((per_expert_model(source()), {expert_name(e, p): deq[k][e] if e % 2 == 0 else deq[k][e].T
                                                      for e in range(E) for p, k in (("w1", "gate"), ("w3", "up"),
                                                                                     ("w2", "down"))}),
                        (fused_model(source(), False), {GATE_UP: np.concatenate([deq["gate"], deq["up"]], axis=1),
                                                        DOWN_3D: deq["down"]})):
        if ROUTER in {t.name for t in model.graph.initializer}:
            want[ROUTER] = dequantized(*tensors["blk.0.ffn_gate_inp.weight"])
        out, report = dyndq.import_weights(model, tmp_path / "moe.gguf", emit="onnxruntime")
        ops = {n.op_type for n in out.graph.node}
        assert ("MatMulNBits" in ops) == (ROUTER in want), ops
        oracle = dyndq.run(with_weights(model, want), x)["y"]
        got = run_onnxruntime(out, x)[0]
        np.testing.assert_allclose(got, oracle, rtol=1e-4, atol=1e-5 * float(np.abs(oracle).max()))


def test_per_expert_safetensors_modules_match_by_name(tmp_path):
    """A GPTQ checkpoint of a mixture of experts holds each expert's modules apart, named as the
    model's (`...experts.3.w1`): they match by name, each its own module, as any linear layer does."""
    save_file = pytest.importorskip("safetensors.numpy").save_file
    from safetensors_checkpoints import gptq_oracle, gptq_tensors

    model = per_expert_model(source())
    checkpoint, want = {}, {}
    for e in range(E):
        for i, (part, (n_in, n_out)) in enumerate((("w1", (H, I)), ("w3", (H, I)), ("w2", (I, H)))):
            module = expert_name(e, part).removesuffix(".weight")
            t = gptq_tensors(n_in, n_out, 4, 128, v1=False, seed=10 * e + i)
            checkpoint.update({f"{module}.{k}": v for k, v in t.items()})
            decoded = gptq_oracle(t, 4, v1=False).astype(np.float32)  # (float16 widened: exact)
            want[expert_name(e, part)] = decoded if e % 2 == 0 else np.ascontiguousarray(decoded.T)
    (tmp_path / "gptq").mkdir()
    save_file(checkpoint, str(tmp_path / "gptq" / "model.safetensors"))
    (tmp_path / "gptq" / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "gptq_v2"}}))
    out, report = dyndq.import_weights(model, tmp_path / "gptq")
    assert {r.weight: r.how for r in report.imported} == {name: "by name" for name in want}
    assert report.left_float == [(ROUTER, (E, H))] and report.unused == []
    probe = onnx.ModelProto()
    probe.CopyFrom(out)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in want.items())
    with np.errstate(all="ignore"):  # (the drawn scales' inf and NaN, on purpose, meet the model's Cast and MatMul)
        got = dyndq.run(probe, {"x": np.zeros((T, H), np.float32)})
    for name, value in want.items():  # (bit for bit; a NaN as a NaN: the float16 NaN's widening is not the point here)
        nan = np.isnan(value)
        assert (np.isnan(got[name]) == nan).all() and (bits(got[name])[~nan] == bits(value)[~nan]).all(), name


_CHILD = r"""
import json, os, sys
from dyndq.checkpoints import import_file
D, form = sys.argv[1], sys.argv[2]
import_file(os.path.join(D, "small_" + form + ".onnx"), os.path.join(D, "small.gguf"), os.path.join(D, "warm.onnx"))

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))

with open("/proc/self/clear_refs", "w") as f:  # (VmHWM from here: the import's peak)
    f.write("5")
base = status("VmRSS")
report = import_file(os.path.join(D, "big_" + form + ".onnx"), os.path.join(D, "big.gguf"), os.path.join(D, form, "q.onnx"))
print("@@ " + json.dumps({"base": base, "peak": status("VmHWM"), "imported": [r.tensor for r in report.imported]}))
"""


def _streamed_case(folder, prefix: str, n_expert: int, rows: int, cols: int) -> int:
    """A GGUF of one stacked Q8_0 gate tensor [n_expert, rows, cols] (gguf's quantizer) and the float
    models holding it per expert and as one 3-D weight, with external data; returns one expert's bytes."""
    from dyndq.model_files import save_model

    values = (np.random.default_rng(3).standard_normal((n_expert, rows, cols)) * 0.05).astype(np.float32)
    data = gguf.quants.quantize(values, qtype("Q8_0"))
    write_gguf(folder / f"{prefix}.gguf", {"blk.0.ffn_gate_exps.weight": ("Q8_0", data)}, "llama", block_count=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cols])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows])
    per_expert = [numpy_helper.from_array(values[e], expert_name(e, "w1")) for e in range(n_expert)]
    nodes = [n for e in range(n_expert) for n in (
        helper.make_node("Transpose", [expert_name(e, "w1")], [f"t{e}"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", f"t{e}"], [f"y{e}"]))] + [helper.make_node("Sum", [f"y{e}" for e in range(n_expert)], ["y"])]
    save_model(helper.make_model(helper.make_graph(nodes, "moe", [x], [y], initializer=per_expert),
                                 opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
               folder / f"{prefix}_experts.onnx", external_data=True)
    del per_expert
    stacked = "model.layers.0.mlp.experts.gate_proj"
    nodes = [helper.make_node("Gather", [stacked, "e0"], ["w0"], axis=0), helper.make_node("Transpose", ["w0"], ["t0"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "t0"], ["y"])]
    save_model(helper.make_model(helper.make_graph(nodes, "moe", [x], [y], initializer=[
        numpy_helper.from_array(values, stacked), numpy_helper.from_array(np.array(0, np.int64), "e0")]),
        opset_imports=[helper.make_opsetid("", 21)], ir_version=10), folder / f"{prefix}_3d.onnx", external_data=True)
    return data.nbytes // n_expert


def test_streamed_per_expert_weights_peak_near_one_expert_and_a_3d_weight_near_the_stacked_tensor(tmp_path):
    """8 experts of 1024 x 2048 (float32: 64 MiB, external data; Q8_0 stacked: 17 MiB, 2.1 MiB an
    expert): the streamed import's peak resident memory over a fresh Python's after a warm-up
    import, with 4 MiB of the allocator's and the interpreter's slack (as test_import_streamed's):
    per-expert weights under 1.5x one expert's bytes (each slice is decoded from its own bytes: the
    stacked tensor would be over that bound), a 3-D weight under 1.5x the stacked tensor."""
    import pathlib
    import subprocess
    import sys

    if not pathlib.Path("/proc/self/clear_refs").exists():
        pytest.skip("no /proc/self/clear_refs here to reset the peak resident memory (Linux has it)")
    _streamed_case(tmp_path, "small", 2, 32, 256)
    expert = _streamed_case(tmp_path, "big", 8, 1024, 2048)
    stacked = 8 * expert
    for form, bound in (("experts", 1.5 * expert + (4 << 20)), ("3d", 1.5 * stacked + (4 << 20))):
        (tmp_path / form).mkdir()
        p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), form], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        run = json.loads(next(line[3:] for line in p.stdout.splitlines() if line.startswith("@@ ")))
        assert len(run["imported"]) == (8 if form == "experts" else 1)
        extra = run["peak"] - run["base"]
        assert extra < bound, (f"{form}: peak - base {extra / 2**20:.1f} MiB: {extra / expert:.2f}x one expert "
                               f"({expert / 2**20:.2f} MiB), bound {bound / 2**20:.1f} MiB")
        print(f"{form}: peak - base {extra / 2**20:.2f} MiB = {extra / expert:.2f}x one expert, {extra / stacked:.2f}x the stacked tensor")
    assert 1.5 * expert + (4 << 20) < stacked  # (the test can fail: the stacked tensor held whole is over the experts' bound)


def test_a_square_3d_weight_is_read_the_way_its_nodes_read_it():
    """Where an expert's matrix is square the shape cannot say: a Gather of the expert feeding
    MatMul's B, or a batched MatMul, reads [E, in, out] (transposed); a Gather then Transpose, or a
    Transpose of perm [0, 2, 1], reads [E, out, in] (as stored)."""
    from dyndq.checkpoints.matching import STORED, TRANSPOSED, float_weights, orientation

    w = numpy_helper.from_array(np.zeros((E, 8, 8), np.float32), "w")
    index = numpy_helper.from_array(np.array(1, np.int64), "i")
    ways = {
        "gather, MatMul": ([helper.make_node("Gather", ["w", "i"], ["we"], axis=0), helper.make_node("MatMul", ["x", "we"], ["y"])],
                           TRANSPOSED),
        "batched MatMul": ([helper.make_node("MatMul", ["x", "w"], ["y"])], TRANSPOSED),
        "gather, Transpose": ([helper.make_node("Gather", ["w", "i"], ["we"], axis=0),
                               helper.make_node("Transpose", ["we"], ["wt"], perm=[1, 0]),
                               helper.make_node("MatMul", ["x", "wt"], ["y"])], STORED),
        "Transpose 0 2 1": ([helper.make_node("Transpose", ["w"], ["wt"], perm=[0, 2, 1]),
                             helper.make_node("MatMul", ["x", "wt"], ["y"])], STORED),
    }
    for label, (nodes, way) in ways.items():
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=[w, index]))
        weight = float_weights(model)["w"]
        assert orientation((E, 8, 8), weight) == way, label
        assert orientation((E + 1, 8, 8), weight) is None  # (another number of experts fits not)


@pytest.mark.parametrize("emit", ["dyndq", "onnxruntime"])
def test_streamed_from_external_data_as_in_memory(tmp_path, emit):
    """Slices and gate and up joined, streamed from a model with external data (each decode written
    to the new data file as it is made): the same rows and the same outputs as the import in memory."""
    from dyndq.checkpoints import import_file
    from dyndq.model_files import load_model, save_model

    moe_file(tmp_path / "moe.gguf", ("Q4_K", "Q8_0", "Q4_0"), fused_architecture())
    x = {"x": np.random.default_rng(7).standard_normal((T, H)).astype(np.float32)}
    for form, model in (("experts", per_expert_model(source())), ("fused", fused_model(source(), False))):
        (tmp_path / form).mkdir()
        save_model(model, tmp_path / form / "f.onnx", external_data=True)
        report = import_file(tmp_path / form / "f.onnx", tmp_path / "moe.gguf", tmp_path / form / "q.onnx", emit=emit)
        in_memory, memory_report = dyndq.import_weights(model, tmp_path / "moe.gguf", emit=emit)
        assert [r.as_dict() for r in report.imported] == [r.as_dict() for r in memory_report.imported]
        assert report.unused == memory_report.unused
        streamed = load_model(tmp_path / form / "q.onnx")
        if emit == "dyndq":
            assert (bits(dyndq.run(streamed, x)["y"]) == bits(dyndq.run(in_memory, x)["y"])).all(), form
        else:
            assert (bits(run_onnxruntime(streamed, x)[0]) == bits(run_onnxruntime(in_memory, x)[0])).all(), form
