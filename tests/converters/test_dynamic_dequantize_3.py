"""DynamicDequantize-3 against the oracle over every code of every type: ONNX's own
DequantizeLinear-28, our kernel, the reference engine, and each export on its engine."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from cases import oracle_3, same_bits
from engines import run_onnxruntime, run_openvino

import dyndq
from dyndq.converters.engines import ENGINES, engine
from dyndq.opdefs import FLOAT_CODES_3, INTEGER_CODES_3, dtypes
from dyndq.plumbing.opsets import ORT_MAX_OPSET
from dyndq.ort_session import OrtSession

# (ONNX's evaluator warns of the overflows and NaNs that every-code inputs make, as IEEE arithmetic says)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CODES = INTEGER_CODES_3 + FLOAT_CODES_3
SCALES = ("float32", "float16", "bfloat16", "float8_e8m0fnu")
OUTS = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
BLOCK = 16


def every_code(dtype: str, rng) -> np.ndarray:
    """Every code of a type of 16 bits or fewer (each bit pattern once, in a random order); for
    int32, its extremes and zero beside random values."""
    row = dtypes.by_name(dtype)
    if dtype == "int32":
        info = np.iinfo(np.int32)
        edge = np.array([info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max], np.int32)
        return np.concatenate([edge, rng.integers(info.min, info.max, 4096 - len(edge), endpoint=True,
                                                  dtype=np.int32)])
    if row.bits == 16:
        return rng.permutation(np.arange(1 << 16, dtype=np.uint16)).view(row.numpy)
    return rng.permutation(np.arange(1 << row.bits, dtype=np.uint8)).view(row.numpy)


def draw_scales(dtype: str, shape, rng) -> np.ndarray:
    """Scales of a dtype: float8e8m0's every exponent can come (NaN's 0xFF included), the float
    ones near the sizes weights have, with a zero, an infinity and a NaN now and then."""
    if dtype == "float8_e8m0fnu":
        return rng.integers(0, 256, shape).astype(np.uint8).view(dtypes.by_name(dtype).numpy)
    values = rng.standard_normal(shape).astype(np.float32) * np.float32(0.02)
    flat = values.reshape(-1)
    for k, special in enumerate((0.0, np.inf, np.nan)):
        if flat.size > 8 * (k + 1) and rng.random() < 0.3:
            flat[rng.integers(flat.size)] = special
    return values.astype(dtypes.by_name(dtype).numpy)


def _tiled(codes: np.ndarray, rows: int, width: int) -> np.ndarray:
    """`rows` x `width` codes holding every one of `codes` (repeated as needed) in each row."""
    reps = -(-width // codes.size)
    return np.stack([np.roll(np.tile(codes, reps)[:width], 7 * r) for r in range(rows)])


# -- ONNX's DequantizeLinear-28 and our op: the same bits over every code ----------------------------

@pytest.mark.parametrize("code", CODES)
def test_dequantize_linear_28_and_version_3_give_the_same_bits_over_every_code(code):
    """ONNX's reference DequantizeLinear-28 (blocked along the last axis, with each scale dtype
    and each output dtype, zero points of the codes' own type for integer codes) and our kernel
    agree bit for bit on every code of the type.  (int32: ONNX's evaluator rounds the code to
    float32, then subtracts an int32 zero point in float64 and multiplies in float64 (NumPy's
    promotion), which our op's one rounding of the exact difference does not match; int32 codes
    go without zero points here, where both round the code once.)"""
    rng = np.random.default_rng(sum(map(ord, code)))
    codes = every_code(code, rng)
    width = -(-codes.size // BLOCK) * BLOCK
    x = _tiled(codes, 2, width)
    for scale_dtype in SCALES:
        s = draw_scales(scale_dtype, (2, width // BLOCK), rng)
        for out_name, out in OUTS.items():
            zp = None
            if code in INTEGER_CODES_3 and code != "int32":
                lo, hi = dtypes.integer_range(code)
                zp = rng.integers(lo, hi, s.shape, endpoint=True).astype(dtypes.by_name(code).numpy)
            inputs = [("x", x), ("s", s)] + ([("z", zp)] if zp is not None else [])
            node = helper.make_node("DequantizeLinear", [n for n, _ in inputs], ["y"], axis=1, block_size=BLOCK,
                                    output_dtype=out)
            graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", out, None)],
                                      initializer=[numpy_helper.from_array(a, n) for n, a in inputs])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
            [theirs] = ReferenceEvaluator(model).run(None, {})
            ours = dyndq.dynamic_dequantize(x, s, zp, qtype="per_group", group_shape=(1, BLOCK), output_dtype=out)
            want = oracle_3(x, s, zp, "per_group", 1, (1, BLOCK), out)
            assert same_bits(ours, want), (code, scale_dtype, out_name)
            assert same_bits(_quiet(theirs), want), (code, scale_dtype, out_name)


def _quiet(y: np.ndarray) -> np.ndarray:
    """float16 NaNs as the one quiet NaN the op gives (0x7E00): ONNX's evaluator keeps sign and payload."""
    y = np.array(y)
    if y.dtype == np.float16:
        y.view(np.uint16)[np.isnan(y)] = 0x7E00
    return y


# -- every engine, every form --------------------------------------------------------------------------

@st.composite
def nodes(draw):
    """A version-3 node's arguments: codes holding every code of their type, a form, scales of
    any dtype, an output dtype, zero points of any kind the op takes."""
    code = draw(st.sampled_from(CODES))
    scale_dtype = draw(st.sampled_from(SCALES))
    out = draw(st.sampled_from(list(OUTS)))
    if scale_dtype == "float8_e8m0fnu" or draw(st.booleans()):
        attrs = {"output_dtype": OUTS[out]}
    else:
        attrs, out = {}, scale_dtype
    form = draw(st.sampled_from(["per_tensor", "per_channel", "per_group", "per_group_rank1"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    codes = every_code(code, rng)[: 4096]
    width = -(-codes.size // BLOCK) * BLOCK
    if form == "per_group_rank1":
        x = _tiled(codes, 1, width).reshape(-1)
        shape, attrs = (width // BLOCK,), {**attrs, "qtype": "per_group", "group_shape": [BLOCK]}
    else:
        x = _tiled(codes, 3, width)
        shape, attrs = {"per_tensor": ((1,), {"qtype": "per_tensor"}),
                        "per_channel": ((3,), {"qtype": "per_channel", "axis": 0}),
                        "per_group": ((3, width // BLOCK), {"qtype": "per_group", "group_shape": [1, BLOCK]})}[form]
        attrs = {**attrs, **({"output_dtype": OUTS[out]} if out != scale_dtype else {})}
    s = draw_scales(scale_dtype, shape, rng)
    zp_kind = draw(st.sampled_from(["none", "own", "int32"] if code in INTEGER_CODES_3
                                   else ["none", "zeros", "minus zeros", "zeros of either sign"]))
    zp = None
    if zp_kind == "own":
        lo, hi = dtypes.integer_range(code)
        zp = rng.integers(lo, hi, shape, endpoint=True).astype(dtypes.by_name(code).numpy)
    elif zp_kind == "int32":
        zp = rng.integers(-2**31, 2**31 - 1, shape, endpoint=True).astype(np.int32)
    elif zp_kind != "none":  # zeros, -0 with probability 0, 1 or 1/2 (the fnuz types have no -0)
        zp = signed_zeros(code, shape, rng, {"zeros": 0.0, "minus zeros": 1.0, "zeros of either sign": 0.5}[zp_kind])
    return x, s, zp, attrs


def signed_zeros(code: str, shape, rng, negative: float) -> np.ndarray:
    """Zeros of a float code type, each -0 with probability `negative`."""
    return np.where(rng.random(shape) < negative, np.float32(-0.0), np.float32(0.0)).astype(dtypes.by_name(code).numpy)


def _model(x, s, zp, attrs, constants: bool) -> onnx.ModelProto:
    arrays = [("x", x), ("s", s)] + ([("z", zp)] if zp is not None else [])
    node = dyndq.make_node([n for n, _ in arrays], ["y"], name="dq", version=3, **attrs)
    out = attrs.get("output_dtype") or dtypes.of(s.dtype).onnx
    if constants:
        inputs, inits = [], [numpy_helper.from_array(a, n) for n, a in arrays]
    else:  # the codes fed at run time; scales and zero points constants
        inputs = [helper.make_tensor_value_info("x", dtypes.of(x.dtype).onnx, list(x.shape))]
        inits = [numpy_helper.from_array(a, n) for n, a in arrays[1:]]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", out, list(x.shape))],
                               initializer=inits)
    return dyndq.make_model(graph, opset=21)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(nodes())
def test_every_engine_gives_the_oracles_bits_for_every_code_type_and_form(node):
    """The kernel, the reference engine running it, the standard export on ONNX's reference
    engine and the onnxruntime export on ONNX Runtime: the oracle's bits, codes as constants and,
    where the engine holds their type, fed at run time.  (OpenVINO: the test after this one.)"""
    x, s, zp, attrs = node
    want = oracle_3(x, s, zp, attrs["qtype"], attrs.get("axis", 1), attrs.get("group_shape"),
                    attrs.get("output_dtype"))
    assert same_bits(dyndq.dynamic_dequantize(x, s, zp, **attrs), want)
    code = x.dtype.name
    for constants in (True, False):
        model = _model(x, s, zp, attrs, constants)
        feeds = {} if constants else {"x": x}
        assert same_bits(dyndq.run(model, feeds)["y"], want), "reference engine, our kernel"
        standard = dyndq.export(model)
        assert same_bits(dyndq.run(standard, feeds)["y"], want), "export onnx, on onnx.reference"
        if not constants and not engine("onnxruntime").holds(code):
            with pytest.raises(dyndq.ValidationError, match="computed at run time"):
                dyndq.export(model, target="onnxruntime")
            continue
        exported = dyndq.export(model, target="onnxruntime")
        onnx.checker.check_model(exported, full_check=True)
        assert next(o.version for o in exported.opset_import if o.domain == "") <= ORT_MAX_OPSET
        got = dyndq.run(exported, feeds, engine="onnxruntime")["y"]
        assert same_bits(got, want), [n.op_type for n in exported.graph.node]


@pytest.mark.openvino
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(nodes())
def test_openvino_gives_the_oracles_bits_but_where_its_deviations_say(node):
    """The openvino export on OpenVINO (CPU, float32 inference precision): the oracle's bits
    except where OpenVINO's own arithmetic differs, as `engines.ENGINES["openvino"].deviations`
    says, measured here: a bfloat16 output (its constant folding truncates), subnormal constants
    and results (flushed; -0 constants made +0), NaN codes (their payload), and int32 zero
    points (it computes int64 in int32)."""
    x, s, zp, attrs = node
    want = oracle_3(x, s, zp, attrs["qtype"], attrs.get("axis", 1), attrs.get("group_shape"),
                    attrs.get("output_dtype"))
    code = x.dtype.name
    for constants in (True, False):
        model = _model(x, s, zp, attrs, constants)
        if not constants and not engine("openvino").holds(code):
            with pytest.raises(dyndq.ValidationError, match="computed at run time"):
                dyndq.export(model, target="openvino")
            continue
        [got] = run_openvino(dyndq.export(model, target="openvino"), {} if constants else {"x": x})
        if want.dtype.name == "bfloat16" or (zp is not None and zp.dtype == np.int32):
            continue  # (its deviations: nothing to compare bit for bit)
        assert _same_but_openvinos_deviations(got, want), (code, attrs)


def _same_but_openvinos_deviations(got, want) -> bool:
    """The same bits, but that a NaN may be any NaN and a subnormal or zero any zero."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    g, w = got.astype(np.float32).reshape(-1), want.astype(np.float32).reshape(-1)
    tiny = np.finfo(want.dtype).tiny
    loose = (np.isnan(w) & np.isnan(g)) | ((np.abs(w) < tiny) & ((g == 0) | (g == w)))
    width = np.uint16 if want.dtype.itemsize == 2 else np.uint32
    same = want.reshape(-1).view(width) == got.reshape(-1).view(width)
    return bool(np.all(same | loose))


def test_what_each_engine_lacks_is_refused_by_name_when_fed_at_run_time():
    """A float4 code fed at run time cannot reach ONNX Runtime (it has no float4e2m1 tensors), nor
    int2 OpenVINO: export names the node, the input and what would do."""
    x = np.arange(16, dtype=np.uint8).view(dtypes.by_name("float4_e2m1fn").numpy).reshape(1, 16)
    model = _model(x, np.ones((1,), np.float32), None, {"qtype": "per_tensor"}, constants=False)
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.export(model, target="onnxruntime")
    [p] = e.value.problems
    assert p.argument == "dq: src" and "FLOAT4E2M1" in p.found and "a constant" in p.allowed
    x2 = np.array([-2, -1, 0, 1], dtype=np.int8).astype(dtypes.by_name("int2").numpy)
    model = _model(x2, np.ones((1,), np.float32), None, {"qtype": "per_tensor"}, constants=False)
    with pytest.raises(dyndq.ValidationError, match="OpenVINO has no INT2 tensors"):
        dyndq.export(model, target="openvino")
    assert dyndq.export(model, target="onnxruntime")  # (ONNX Runtime runs int2)


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("scale_dtype", SCALES)
def test_each_target_gets_an_opset_and_ir_version_its_engine_loads(code, scale_dtype):
    """ONNX Runtime loads ai.onnx <= 26 and IR <= 13: its export of every type stays within;
    no type an engine lacks is left in its export."""
    x = _tiled(every_code(code, np.random.default_rng(0)), 4, 16)
    attrs = {"qtype": "per_group", "group_shape": [1, BLOCK], "output_dtype": TensorProto.FLOAT}
    model = _model(x, draw_scales(scale_dtype, (4, 1), np.random.default_rng(1)), None, attrs, constants=True)
    for target, e in ENGINES.items():
        exported = dyndq.export(model, target=target)
        held = {dtypes.by_onnx(t.data_type).name for t in exported.graph.initializer}
        held |= {dtypes.by_onnx(n.attribute[0].t.data_type).name for n in exported.graph.node if n.op_type == "Constant"}
        assert not held & e.lacks, (target, held & e.lacks)
        if target == "onnxruntime":
            assert next(o.version for o in exported.opset_import if o.domain == "") <= ORT_MAX_OPSET
            assert exported.ir_version <= 13


# -- lifting: DequantizeLinear-23/24/25/28 with any type, and back ----------------------------------

@pytest.mark.parametrize("code, scale_dtype, opset", [
    ("float4_e2m1fn", "float8_e8m0fnu", 24), ("int2", "float32", 25), ("uint2", "float16", 25),
    ("float6_e2m3fn", "bfloat16", 28), ("float8_e4m3fn", "float8_e8m0fnu", 24), ("int16", "float32", 23),
    ("float6_e3m2fn", "float8_e8m0fnu", 28), ("uint16", "float8_e8m0fnu", 24),
])
@pytest.mark.parametrize("form", ["per_tensor", "per_axis", "blocked"])
def test_dequantize_linear_of_any_type_lifts_to_version_3_exactly_and_exports_back(code, scale_dtype, opset, form):
    rng = np.random.default_rng(3)
    x = _tiled(every_code(code, rng)[:256], 4, 64)
    shape, attrs = {"per_tensor": ((), {}), "per_axis": ((4,), {"axis": 0}),
                    "blocked": ((4, 64 // BLOCK), {"axis": 1, "block_size": BLOCK})}[form]
    s = draw_scales(scale_dtype, shape, rng)
    if scale_dtype == "float8_e8m0fnu":
        attrs = {**attrs, "output_dtype": TensorProto.FLOAT16}
    inputs = [("x", x), ("s", s)]
    if code in INTEGER_CODES_3:
        lo, hi = dtypes.integer_range(code)
        inputs.append(("z", rng.integers(lo, hi, shape, endpoint=True).astype(x.dtype)))
    node = helper.make_node("DequantizeLinear", [n for n, _ in inputs], ["y"], name="dql", **attrs)
    out = attrs.get("output_dtype") or dtypes.of(s.dtype).onnx
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", out, list(x.shape))],
                              initializer=[numpy_helper.from_array(a, n) for n, a in inputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    [want] = ReferenceEvaluator(model).run(None, {})
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and not report.skipped
    [ours] = lifted.graph.node
    assert ours.domain == dyndq.DOMAIN and [o.version for o in lifted.opset_import if o.domain == dyndq.DOMAIN] == [3]
    assert same_bits(dyndq.run(lifted, {})["y"], _quiet(want))
    back = dyndq.export(lifted)
    assert "DequantizeLinear" in [n.op_type for n in back.graph.node]
    assert same_bits(dyndq.run(back, {})["y"], _quiet(want))
    exported = dyndq.export(lifted, target="onnxruntime")
    assert same_bits(dyndq.run(exported, {}, engine="onnxruntime")["y"], _quiet(want))


# -- nested scales by composition: NVFP4, integer block scales --------------------------------------------------------

def _nvfp4():
    """NVFP4: float4e2m1 codes in blocks of 16, float8e4m3fn block scales, one float32 tensor
    scale g: the first node dequantizes the block scales by g (float32(e4m3) * g, rounded to
    float32); its output is the scales of the second (code * that, rounded to float32)."""
    rng = np.random.default_rng(7)
    codes = _tiled(every_code("float4_e2m1fn", rng), 8, 64)
    block = rng.integers(0, 0x7F, (8, 4)).astype(np.uint8).view(dtypes.by_name("float8_e4m3fn").numpy)  # positive
    g = np.array([0.0123], np.float32)
    first = dyndq.make_node(["block_scales", "g"], ["scales"], name="nvfp4_scales", version=3)
    second = dyndq.make_node(["codes", "scales"], ["w"], name="nvfp4_codes", version=3, qtype="per_group",
                             group_shape=[1, 16])
    inits = [numpy_helper.from_array(a, n) for n, a in (("codes", codes), ("block_scales", block), ("g", g))]
    graph = helper.make_graph([first, second], "nvfp4", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 64])],
                              initializer=inits)
    scales = (block.astype(np.float32) * g[0]).astype(np.float32)
    return dyndq.make_model(graph), (codes.astype(np.float32) * np.repeat(scales, 16, axis=1)).astype(np.float32)


def _two_level():
    """Scales held as int8 per block, times a float32 per output channel: the first node
    dequantizes the block scales per channel (float32(int8) * channel scale), its output is the
    scales of the int4 codes."""
    rng = np.random.default_rng(11)
    codes = rng.integers(-8, 8, (6, 64)).astype(dtypes.by_name("int4").numpy)
    block = rng.integers(1, 128, (6, 4)).astype(np.int8)
    channel = (rng.random(6) * 0.01).astype(np.float32)
    first = dyndq.make_node(["block", "channel"], ["scales"], name="block_scales", qtype="per_channel", axis=0)
    second = dyndq.make_node(["codes", "scales"], ["w"], name="codes", qtype="per_group", group_shape=[1, 16])
    inits = [numpy_helper.from_array(a, n) for n, a in (("codes", codes), ("block", block), ("channel", channel))]
    graph = helper.make_graph([first, second], "two_level", [],
                              [helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 64])], initializer=inits)
    scales = (block.astype(np.float32) * channel[:, None]).astype(np.float32)
    return dyndq.make_model(graph), codes.astype(np.float32) * np.repeat(scales, 16, axis=1)


@pytest.mark.parametrize("build", [_nvfp4, _two_level], ids=["nvfp4", "int8-block-scales-per-channel"])
def test_nested_scales_are_two_nodes_whose_order_of_multiplication_the_graph_fixes(build):
    """dst = float32(code * float32(block_scale * outer)): the reference engine, the standard
    export on ONNX's engine and the onnxruntime export on ONNX Runtime give those bits."""
    model, want = build()
    assert same_bits(dyndq.run(model, {})["w"], want)
    assert same_bits(dyndq.run(dyndq.export(model), {})["w"], want)
    assert same_bits(dyndq.run(dyndq.export(model, target="onnxruntime"), {}, engine="onnxruntime")["w"], want)


@pytest.mark.openvino
@pytest.mark.parametrize("build", [_nvfp4, _two_level], ids=["nvfp4", "int8-block-scales-per-channel"])
def test_nested_scales_on_openvino(build):
    model, want = build()
    [got] = run_openvino(dyndq.export(model, target="openvino"), {})
    assert same_bits(got, want)


@pytest.mark.parametrize("code", ["float8_e4m3fn", "int2", "int32"])
def test_inside_a_model_local_function_where_no_dtype_is_known(code):
    """A function's nodes are typed by nothing: version 3's lowering there takes the route exact
    for every code type (float64: Cast, Sub, Cast to float32) and CastLike to the scales' dtype;
    every call gives the oracle's bits on the reference engine and ONNX Runtime."""
    rng = np.random.default_rng(5)
    x = _tiled(every_code(code, rng)[:256], 2, 32)
    zp = None if code.startswith("float") else rng.integers(*dtypes.integer_range(code), (2, 2), endpoint=True
                                                            ).astype(x.dtype)
    s = draw_scales("float16", (2, 2), rng)
    names = ["w", "s"] + (["z"] if zp is not None else [])
    inner = dyndq.make_node(names, ["y"], qtype="per_group", group_shape=[1, 16])
    f = helper.make_function("local", "Deq", names, ["y"], [inner],
                             [helper.make_opsetid("", 21), dyndq.opset_import(3)])
    call = helper.make_node("Deq", names, ["out"], domain="local")
    arrays = [("w", x), ("s", s)] + ([("z", zp)] if zp is not None else [])
    graph = helper.make_graph([call], "g", [], [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [2, 32])],
                              initializer=[numpy_helper.from_array(a, n) for n, a in arrays])
    model = helper.make_model(graph, functions=[f], opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import(3),
                                                                   helper.make_opsetid("local", 1)])
    model.ir_version = 13
    want = oracle_3(x, s, zp, "per_group", 1, (1, 16))
    assert same_bits(dyndq.run(model, {})["out"], want)
    assert same_bits(dyndq.run(dyndq.export(model), {})["out"], want)
    assert same_bits(dyndq.run(dyndq.export(model, target="onnxruntime"), {}, engine="onnxruntime")["out"], want)


# -- signed zeros and NaNs, as the standard says --------------------------------------------------------

SIGNED_FLOAT_CODES = [c for c in FLOAT_CODES_3 if "fnuz" not in c]  # (the fnuz types have no -0)


def _form(form: str, width: int):
    """(the parameters' shape, the attributes) of a form over codes [3, width]."""
    return {"per_tensor": ((1,), {"qtype": "per_tensor"}), "per_channel": ((3,), {"qtype": "per_channel", "axis": 0}),
            "per_group": ((3, width // BLOCK), {"qtype": "per_group", "group_shape": [1, BLOCK]})}[form]


def _dql(x, s, z, opset, **attrs) -> onnx.ModelProto:
    inputs = [("x", x), ("s", s)] + ([("z", z)] if z is not None else [])
    node = helper.make_node("DequantizeLinear", [n for n, _ in inputs], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in inputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("code", SIGNED_FLOAT_CODES)
def test_each_engine_subtracts_a_minus_zero_zero_point_in_its_dequantize_linear_as_its_row_says(code):
    """DequantizeLinear-28 computes (x - x_zero_point) * x_scale for float codes too ("the
    dequantization formula remains the same"), so a -0 code minus a -0 zero point is +0.  The engine
    table's `dql_float_zero_points` says which engines' DequantizeLinear do so, measured here:
    onnx.reference for float6 (it leaves float8 and float4 zero points out: -0 stays -0); ONNX
    Runtime refuses a -0 float8 zero point."""
    minus = np.array([-0.0] * 4, np.float32).astype(dtypes.by_name(code).numpy)
    s = np.array(1.0, np.float32)
    standard = np.zeros(4, np.float32)  # (-0) - (-0) = +0
    [reference] = ReferenceEvaluator(_dql(minus, s, minus[:1].reshape(()), 28)).run(None, {})
    assert same_bits(reference, standard) == (code in ENGINES["onnx"].dql_float_zero_points)
    assert not ENGINES["onnxruntime"].dql_float_zero_points
    if code in ENGINES["onnxruntime"].dql_codes:
        with pytest.raises(Exception, match="all zero points should be 0"):
            dyndq.run(_dql(minus, s, minus[:1].reshape(()), 21), {}, engine="onnxruntime")


def test_onnx_runtime_deletes_a_sub_of_a_constant_minus_zero():
    """Why the export writes x - (-0) as a Where: ONNX Runtime's graph optimizer (NoopElimination,
    its basic level) deletes x - c for a constant c of zeros, -0 included (here float8 codes and a
    -0 zero point Cast to float32, then times -0.5: a -0 code gives (-0 - (-0)) * -0.5 = -0, and +0
    once the Sub is gone)."""
    f8 = dtypes.by_name("float8_e4m3fn").numpy
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["z"], ["zf"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["xf", "zf"], ["d"]), helper.make_node("Mul", ["s", "d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              initializer=[numpy_helper.from_array(np.array([-0.0], np.float32).astype(f8), "z"),
                                           numpy_helper.from_array(np.array([-0.5], np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    x = np.array([-0.0, 1.0], np.float32).astype(f8)
    assert same_bits(run_onnxruntime(model, {"x": x}, level="off")[0], np.array([-0.0, -0.5], np.float32))
    assert same_bits(run_onnxruntime(model, {"x": x}, level="basic")[0], np.array([0.0, -0.5], np.float32))


@pytest.mark.openvino
def test_openvino_s_dequantize_linear_on_minus_zero_zero_points_and_nan_scales_as_its_row_says():
    """OpenVINO's DequantizeLinear leaves a -0 float8 zero point out (not in its row's
    dql_float_zero_points: zero points take the decode route there anyway), and its blocked one
    gives the code's NaN against a NaN scale (its row: no blocked_nan_of_scale)."""
    e = ENGINES["openvino"]
    x = np.array([0x80, 0x00, 0x7F, 0xFF] * 8, np.uint8).view(dtypes.by_name("float8_e4m3fn").numpy).reshape(2, 16)
    minus = np.array(-0.0, np.float32).astype(x.dtype)

    def fed(model):  # the codes fed (its constant folding makes a -0 constant +0)
        model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, list(x.shape)))
        model.graph.initializer.pop(0)
        return model

    [got] = run_openvino(fed(_dql(x, np.array(1.0, np.float32), minus, 21)), {"x": x})
    assert same_bits(got[0, :2], np.array([-0.0, 0.0], np.float32)) and not e.dql_float_zero_points
    s = np.array([[0x7FC00001], [0xFFC00002]], np.uint32).view(np.float32)
    [got] = run_openvino(fed(_dql(x, s, None, 21, axis=0, block_size=1)), {"x": x})
    assert np.array_equal(got.view(np.uint32)[:, 2:4], [[0x7FC00000, 0xFFC00000]] * 2) and not e.blocked_nan_of_scale


@pytest.mark.parametrize("code", SIGNED_FLOAT_CODES)
@pytest.mark.parametrize("form", ["per_tensor", "per_channel", "per_group"])
@pytest.mark.parametrize("negative", [1.0, 0.5])
def test_minus_zero_zero_points_give_the_standards_bits_on_every_engine(code, form, negative):
    """Float codes (every code, -0 among them) with zero points of -0 (all, or some): the kernel,
    the reference engine, the standard export on ONNX's engine and the onnxruntime export on ONNX
    Runtime give (x - zp) * scale in IEEE arithmetic; no DequantizeLinear of an engine that does not
    subtract them gets them (the decode route's Sub does)."""
    rng = np.random.default_rng(17)
    codes = every_code(code, rng)
    x = _tiled(codes, 3, -(-codes.size // BLOCK) * BLOCK)
    shape, attrs = _form(form, x.shape[1])
    s = draw_scales("float32", shape, rng)
    s.reshape(-1)[0] = -0.5  # (a negative scale: +0 * -0.5 is -0)
    zp = signed_zeros(code, shape, rng, negative)
    zp.reshape(-1)[0] = np.float32(-0.0)
    want = oracle_3(x, s, zp, attrs["qtype"], attrs.get("axis", 1), attrs.get("group_shape"))
    assert not same_bits(want, oracle_3(x, s, None, attrs["qtype"], attrs.get("axis", 1), attrs.get("group_shape")))
    assert same_bits(dyndq.dynamic_dequantize(x, s, zp, **attrs), want)
    for constants in (True, False):
        model = _model(x, s, zp, attrs, constants)
        feeds = {} if constants else {"x": x}
        assert same_bits(dyndq.run(model, feeds)["y"], want)
        for target in ENGINES:
            if target == "openvino" or (not constants and not engine(target).holds(code)):
                continue
            exported = dyndq.export(model, target=target)
            dql = [n for n in exported.graph.node if n.op_type == "DequantizeLinear"]
            assert all(len(n.input) < 3 for n in dql) or code in engine(target).dql_float_zero_points, target
            got = dyndq.run(exported, feeds, engine="reference" if target == "onnx" else "onnxruntime")["y"]
            assert same_bits(got, want), (target, [n.op_type for n in exported.graph.node])
            if target == "onnxruntime":  # (and at its default level, all of its graph optimizations)
                assert same_bits(run_onnxruntime(exported, feeds, level="all")[0], want)


def test_zero_points_of_float_codes_fed_at_run_time_are_subtracted_on_onnx_runtime():
    """Zero points computed at run time may hold -0: the onnxruntime export subtracts them itself
    (a zero code whose zero point is -0 made +0) instead of handing them to a DequantizeLinear that
    refuses a -0; +0 ones give the same as none."""
    code = "float8_e4m3fn"
    rng = np.random.default_rng(5)
    x = _tiled(every_code(code, rng), 3, 256)
    s = draw_scales("float32", (3, 256 // BLOCK), rng)
    node = dyndq.make_node(["x", "s", "z"], ["y"], name="dq", version=3, qtype="per_group", group_shape=[1, BLOCK])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("z", TensorProto.FLOAT8E4M3FN, list(s.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
                              initializer=[numpy_helper.from_array(x, "x"), numpy_helper.from_array(s, "s")])
    exported = dyndq.export(dyndq.make_model(graph, opset=21), target="onnxruntime")
    assert "DequantizeLinear" not in [n.op_type for n in exported.graph.node]
    for negative in (0.0, 1.0, 0.5):
        zp = signed_zeros(code, s.shape, rng, negative)
        want = oracle_3(x, s, zp, "per_group", 1, (1, BLOCK))
        assert same_bits(dyndq.run(exported, {"z": zp}, engine="onnxruntime")["y"], want), negative


def _nan_codes_and_scales(code: str, rng):
    """Every code of a float8 type beside scales holding NaNs of either sign and several payloads."""
    x = _tiled(every_code(code, rng), 2, 256)
    s = draw_scales("float32", (2, 256 // BLOCK), rng)
    s.reshape(-1)[::3] = np.array([0x7FC00001, 0xFFC00002, 0x7FC12345, 0xFFFFFFFF], np.uint32).view(np.float32)[
        np.arange(s.reshape(-1)[::3].size) % 4]
    return x, s


def test_onnx_runtime_s_blocked_dequantize_linear_gives_the_scale_s_nan_as_its_row_says():
    """A NaN code times a NaN scale: IEEE 754 leaves open which NaN comes out.  ONNX Runtime's blocked
    DequantizeLinear gives the scale's (its per-tensor and per-axis ones the code's, as the kernel
    does): `blocked_nan_of_scale` in its row, measured here."""
    x, s = _nan_codes_and_scales("float8_e4m3fn", np.random.default_rng(2))
    [got] = dyndq.run(_dql(x, s, None, 21, axis=1, block_size=BLOCK), {}, engine="onnxruntime").values()
    both = np.isnan(x.astype(np.float32)) & np.isnan(np.repeat(s, BLOCK, axis=1))
    scales_nans = np.repeat(s, BLOCK, axis=1).view(np.uint32) | np.uint32(0x00400000)
    assert both.any() and ENGINES["onnxruntime"].blocked_nan_of_scale
    assert np.array_equal(got.view(np.uint32)[both], scales_nans[both])
    assert not any(e.blocked_nan_of_scale for name, e in ENGINES.items() if name != "onnxruntime")


@pytest.mark.parametrize("code", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_blocked_float8_nan_codes_keep_their_nan_against_nan_scales_on_onnx_runtime(code, out):
    """The onnxruntime export takes the codes' NaNs back after ONNX Runtime's blocked
    DequantizeLinear (Where(IsNaN(codes), codes, y)) where the scales may hold a NaN (computed at
    run time, or a constant holding one): the kernel's bits, the code's NaN.  Constant scales
    without a NaN keep the one DequantizeLinear."""
    x, s = _nan_codes_and_scales(code, np.random.default_rng(4))
    attrs = {"qtype": "per_group", "group_shape": [1, BLOCK], "output_dtype": OUTS[out]}
    want = oracle_3(x, s, None, "per_group", 1, (1, BLOCK), OUTS[out])
    for constants in (True, False):
        model = _model(x, s, None, attrs, constants)
        exported = dyndq.export(model, target="onnxruntime")
        assert "Where" in [n.op_type for n in exported.graph.node]
        for level in ("basic", "all"):
            got = run_onnxruntime(exported, {} if constants else {"x": x}, level=level)[0]
            assert same_bits(got, want), level
    fed = _model(x, s, None, attrs, True)
    fed.graph.initializer.pop(1)  # the scales fed at run time
    fed.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, list(s.shape)))
    exported = dyndq.export(fed, target="onnxruntime")
    assert same_bits(dyndq.run(exported, {"s": s}, engine="onnxruntime")["y"], want)
    finite = np.nan_to_num(s)
    plain = dyndq.export(_model(x, finite, None, attrs, True), target="onnxruntime")
    assert [n.op_type for n in plain.graph.node if n.op_type in ("DequantizeLinear", "Where")] == ["DequantizeLinear"]


@pytest.mark.parametrize("fed", [False, True], ids=["constant codes", "codes fed"])
def test_a_float8_model_with_minus_zero_zero_points_checks_exports_and_runs_on_onnx_runtime(tmp_path, capsys, fed):
    """The command line end to end: `dyndq check` passes a float8 model whose zero points are -0,
    `dyndq export --target onnxruntime` writes a file ONNX Runtime loads and runs (its own session,
    default settings) with the kernel's bits, every code's (-0 among them, made +0)."""
    import onnxruntime as ort

    from dyndq.cli import main

    code = "float8_e4m3fn"
    rng = np.random.default_rng(9)
    x = _tiled(every_code(code, rng), 2, 256)
    s = draw_scales("float32", (2, 256 // BLOCK), rng)
    zp = signed_zeros(code, s.shape, rng, 1.0)
    model = _model(x, s, zp, {"qtype": "per_group", "group_shape": [1, BLOCK]}, constants=not fed)
    path, out = tmp_path / "f8.onnx", tmp_path / "f8.ort.onnx"
    onnx.save(model, path)
    assert main(["check", str(path)]) == 0
    assert main(["export", str(path), str(out), "--target", "onnxruntime"]) == 0
    capsys.readouterr()
    session = OrtSession(onnx.load(out, load_external_data=False), level="all", path=str(out))  # (as a user loads it)
    [got] = session.run(["y"], {"x": x} if fed else {})  # (the float8 codes fed as their bits)
    want = dyndq.dynamic_dequantize(x, s, zp, qtype="per_group", group_shape=(1, BLOCK))
    assert same_bits(got, want)
    assert not same_bits(want, dyndq.dynamic_dequantize(x, s, qtype="per_group", group_shape=(1, BLOCK)))
