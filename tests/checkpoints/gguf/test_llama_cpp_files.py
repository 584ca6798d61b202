"""GGUF files of a real model made by llama.cpp's own converter and quantizer (all-MiniLM-L6-v2 in
F32, Q4_K_M, Q6_K, Q8_0 and IQ4_NL: tests/llama_cpp_ggufs.py): every tensor of each, read by
dyndq.checkpoints.gguf.read, gives through its nodes gguf.quants.dequantize's float32 bits on the
reference engine and on ONNX Runtime.  `make test-gguf-real` makes the files and runs these;
`make test` runs them where the files are there, and skips them, saying so, where they are not."""
from __future__ import annotations

import pytest

from dyndq.checkpoints import gguf as ours
import llama_cpp_ggufs as made

pytestmark = pytest.mark.llama_cpp
WHY_NOT = made.missing()
KINDS = ("F32", *made.QUANTS)


def gguf_files():
    """(path, type histogram) of each GGUF file llama.cpp made here, F32 first: what the import's
    end-to-end test (onto the MiniLM ONNX export) walks."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    yield from made.files()


@pytest.mark.parametrize("kind", KINDS)
def test_every_tensor_of_llama_cpps_file_dequantizes_exactly(kind):
    from gguf_blocks import check_exact  # (imports gguf, skipping where it is not installed)

    if WHY_NOT:
        pytest.skip(WHY_NOT)
    seen = []
    for tensor in ours.read(made.path_of(kind)):
        check_exact(tensor.type_name, tensor.data, tensor.shape)
        seen.append(tensor.type_name)
    assert len(seen) == sum(made.histogram(made.path_of(kind)).values()) > 0


@pytest.mark.parametrize("kind", made.QUANTS)
def test_llama_cpps_quantizer_wrote_the_type_asked_for(kind):
    """(so that a quantizer writing everything F32 or F16 cannot pass the test above vacuously)"""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    counts = made.histogram(made.path_of(kind))
    main = {"Q4_K_M": "Q4_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "IQ4_NL": "IQ4_NL"}[kind]
    assert counts.get(main, 0) > 0, counts


def test_the_helper_yields_each_file_with_its_histogram():
    listed = list(gguf_files())
    assert [p.name for p, _ in listed] == [f"minilm-{k}.gguf" for k in KINDS]
    assert all(sum(h.values()) > 0 for _, h in listed)


@pytest.mark.parametrize("kind", made.QUANTS)
def test_llama_cpps_file_imported_onto_the_minilm_export_computes_the_dequantized_model(kind):
    """`dyndq.import_weights` of llama.cpp's file onto the MiniLM ONNX export (`make
    test-trained-export`): every weight matched (torch's `onnx::MatMul_*` names by shape and
    closeness, the rest by gguf's BERT name map), and the model's sentence embeddings equal those of
    the float model holding gguf.quants.dequantize's weights (oriented as the graph reads them):
    bit for bit on the reference engine (the same MatMul operands in NumPy), within 1e-5 of the
    largest on ONNX Runtime (a weight computed at run time against one stored, which its MatMul
    prepacks and may sum in another order)."""
    import gguf
    import numpy as np
    import onnx

    import dyndq
    import trained_models
    from engines import run_onnxruntime

    if WHY_NOT:
        pytest.skip(WHY_NOT)
    if (why := trained_models.minilm_missing()) is not None:
        pytest.skip(why)
    model = onnx.load(str(trained_models.path_of("minilm")))
    out, report = dyndq.import_weights(model, made.path_of(kind))
    assert not report.left_float and not report.unused, report.table()
    raw = {t.name: t for t in gguf.GGUFReader(str(made.path_of(kind))).tensors}
    weights = {}
    for row in report.imported:
        t = raw[row.tensor]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(reversed(t.shape.tolist())))
        weights[row.weight] = values.T if row.orientation == "transposed" else values
    by_shape = [row for row in report.imported if row.how == "by shape"]
    assert by_shape and max(row.error for row in by_shape) < 0.1  # (each close to the float weight it replaced)
    assert any(row.how == "by GGUF's name map" for row in report.imported)
    oracle = onnx.ModelProto()
    oracle.CopyFrom(model)
    for t in oracle.graph.initializer:
        if t.name in weights:
            assert tuple(t.dims) == weights[t.name].shape, t.name
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(weights[t.name]), t.name))
    feeds = trained_models.batched(trained_models.minilm_inputs("held", 4))
    ours, theirs = dyndq.run(out, feeds), dyndq.run(oracle, feeds)
    for name, value in theirs.items():
        assert (ours[name].view(np.uint32) == value.view(np.uint32)).all(), (kind, name)
    got = run_onnxruntime(dyndq.export(out, target="onnxruntime"), feeds)
    for value, name in zip(got, [o.name for o in out.graph.output]):
        np.testing.assert_allclose(value, theirs[name], rtol=1e-5, atol=1e-5 * float(np.abs(theirs[name]).max()))


# ggml's own C dequantization (tests/llama_cpp/dequantize.c: gguf_init_from_file, then each type's
# to_float, llama.cpp's runtime decode), built by `make test-gguf-real` beside the quantizer.
C_WHY_NOT = made.dequantizer_missing()


def ours_on_both_engines(name, data, shape):
    """Our nodes' float32 values of GGUF tensor `data` on the reference engine and on ONNX Runtime."""
    import numpy as np

    import dyndq
    from engines import run_onnxruntime
    from gguf_blocks import model_of

    placed = ours.nodes(ours.GGUFTensor(f"t_{name}", name, shape, data))
    model = model_of(placed, shape)
    with np.errstate(all="ignore"):  # (inf * 0 and inf - inf, which drawn scales make on purpose)
        reference = dyndq.run(model, {})[placed.output]
    return {"reference": reference, "onnxruntime": run_onnxruntime(dyndq.export(model, target="onnxruntime"), {})[0]}


def differing(name, got, want, who):
    """How `got` differs from ggml's C `want`, bit for bit (as uint32): a set of (name, who, kind),
    kind "NaN sign" or "signalling NaN quieted" where each differing value is a NaN in both (the
    only two kinds the drawn blocks make: see the test), else one naming the first value that differs."""
    import numpy as np

    got, want = np.ravel(got), np.ravel(want)
    if got.shape != want.shape:
        return {(name, who, f"{got.size} values, ggml's C {want.size}")}
    g, w = got.view(np.uint32), want.view(np.uint32)
    differ = np.flatnonzero(g != w)
    if not differ.size:
        return set()
    nan = np.isnan(got[differ]) & np.isnan(want[differ])
    if not nan.all():
        i = differ[~nan][0]
        return {(name, who, f"{(~nan).sum()} of {want.size} values differ, not both NaN, the first at {i}: "
                            f"{g[i]:#010x}, C {w[i]:#010x}")}
    kinds = set()
    sign = (g[differ] ^ w[differ]) == 0x80000000
    quieted = (w[differ] == g[differ] | 0x00400000) & (g[differ] & 0x00400000 == 0)
    if sign.any():
        kinds.add((name, who, "NaN sign"))
    if quieted.any():
        kinds.add((name, who, "signalling NaN quieted"))
    if not (sign | quieted).all():
        i = differ[~(sign | quieted)][0]
        kinds.add((name, who, f"other NaN bits, the first at {i}: {g[i]:#010x}, C {w[i]:#010x}"))
    return kinds


def check_against_c(path, tensors, program=None):
    """Each of `tensors` (GGUFTensors of GGUF file `path`) dequantized by gguf.quants.dequantize
    and by ours (reference engine and ONNX Runtime), against ggml's C dequantization bit for bit
    (`program`: the dequantizer, by default 0.3.16's ggml's): the set of differences found, each
    as `differing` says it (empty: every bit the same)."""
    import gguf
    import numpy as np

    from gguf_blocks import qtype

    c = made.c_dequantize(path, program)
    assert list(c) == [t.name for t in tensors], (list(c), [t.name for t in tensors])
    found = set()
    for t in tensors:
        with np.errstate(all="ignore"):
            theirs = gguf.quants.dequantize(t.data, qtype(t.type_name)).astype(np.float32, copy=False)
        found |= differing(t.type_name, theirs, c[t.name], "gguf")
        for engine, values in ours_on_both_engines(t.type_name, t.data, t.shape).items():
            found |= differing(t.type_name, values, c[t.name], engine)
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_ggmls_c_dequantization_of_llama_cpps_file_is_ggufs_and_ours(kind):
    if WHY_NOT or C_WHY_NOT:
        pytest.skip(WHY_NOT or C_WHY_NOT)
    tensors = list(ours.read(made.path_of(kind)))
    assert check_against_c(made.path_of(kind), tensors) == set()
    assert len(tensors) == sum(made.histogram(made.path_of(kind)).values()) > 0


# Where ggml's C and gguf's Python disagree: only on NaNs, both NaN, in two ways (drawn blocks; the
# real files hold no NaN).  F16: ggml's fp16 -> fp32 is arithmetic (a multiply), which quiets a
# signalling NaN (0x7C01 -> 0x7fc02000), where NumPy's conversion keeps it (0x7f802000).  IQ2_XXS,
# IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, in blocks whose float16 d is a NaN: gguf negates a value whose
# sign bit is set (the sign bit of the NaN flips), ggml multiplies by -1.f (x86 keeps the NaN's
# sign).  We are held to gguf's Python there (tests/checkpoints/gguf/test_block_types.py: bit for
# bit, NaNs too): a NaN's sign and quiet bit carry no number, no later op of either runtime reads
# them, and ggml's own bits for them vary with the build (F16C's vcvtph2ps, SIMD to_float), while
# matching C would cost ops of our own against ONNX's Cast, which keeps them.  Every other bit,
# every non-NaN value of every type, is held to the C.
NAN_DIFFERENCES = {"F16": "signalling NaN quieted", "IQ2_XXS": "NaN sign", "IQ2_XS": "NaN sign",
                   "IQ2_S": "NaN sign", "IQ3_XXS": "NaN sign", "IQ3_S": "NaN sign"}


def test_ggmls_c_dequantization_of_drawn_blocks_of_every_type(tmp_path):
    """A GGUF file (gguf's writer) holding, for each block type we decode that this ggml knows,
    the drawn blocks of the block-type tests (every code value, float16 scales at ±0, subnormals,
    the largest finite, ±inf and NaNs; every one-byte scale value), read by ggml's gguf reader and
    dequantized by its to_float: gguf's Python and ours give its bits, but for NAN_DIFFERENCES."""
    from gguf_blocks import block_of, drawn, known, write_gguf

    if C_WHY_NOT:
        pytest.skip(C_WHY_NOT)
    ggml_has = set(made.c_types())
    types = [n for n in known(ours.names()) if n in ggml_has]
    assert set(known(ours.names())) - set(types) <= {"NVFP4"}  # (ggml 4227c9b predates NVFP4: the test below)
    tensors = {}
    for name in types:
        block = block_of(name)[0]
        tensors[f"t_{name}"] = (name, drawn(name, 16, 2048 // block, seed=2))
    write_gguf(tmp_path / "drawn.gguf", tensors)
    read = list(ours.read(tmp_path / "drawn.gguf"))
    assert [t.type_name for t in read] == types
    want = {(name, who, kind) for name, kind in NAN_DIFFERENCES.items() for who in ("gguf", "reference", "onnxruntime")}
    assert check_against_c(tmp_path / "drawn.gguf", read) == want


def test_a_newer_ggmls_c_dequantization_of_drawn_nvfp4_blocks(tmp_path):
    """NVFP4, which ggml 4227c9b predates, against the to_float of llama-cpp-python 0.3.36's ggml
    (nvfp4_dequantizer: its ggml-base alone): drawn blocks (every code, every e4m3 scale byte in
    each of a block's four scale positions: the sign bit and 0x7F that ggml reads as 0 included) in
    a GGUF file by gguf's writer, read by that ggml's gguf reader: gguf's Python and ours (both
    engines) give its bits, NaNs included (NVFP4 makes none)."""
    import numpy as np

    from gguf_blocks import block_of, drawn, known, write_gguf

    why_not = made.nvfp4_dequantizer_missing()
    if why_not:
        pytest.skip(why_not)
    if "NVFP4" not in known(ours.names()):
        pytest.skip("the installed gguf has no NVFP4 (gguf 0.19 and later)")
    program = made.nvfp4_dequantizer_path()
    assert "NVFP4" in made.c_types(program)
    data = drawn("NVFP4", 16, 4096 // block_of("NVFP4")[0], seed=3)
    assert all(len(np.unique(data.reshape(-1, block_of("NVFP4")[1])[:, at])) == 256 for at in range(4))
    write_gguf(tmp_path / "nvfp4.gguf", {"t_NVFP4": ("NVFP4", data)})
    read = list(ours.read(tmp_path / "nvfp4.gguf"))
    assert [t.type_name for t in read] == ["NVFP4"]
    c = made.c_dequantize(tmp_path / "nvfp4.gguf", program)["t_NVFP4"]
    assert np.count_nonzero(c) > c.size // 2 and np.isfinite(c).all()  # (values, not a decode of nothing)
    assert check_against_c(tmp_path / "nvfp4.gguf", read, program) == set()
