"""`quantize --budget` on a trained model, beside uniform 4-bit search at the same bits per weight:
PP-OCR's text recognizer (`--model ppocr`, `make test-models` fetches it) or sentence-transformers'
all-MiniLM-L6-v2 (`--model minilm`, `make test-trained-export` exports it; tests/trained_models.py).

    .venv/bin/python benchmarks/bench_budget_trained.py [--model ppocr|minilm] [--samples 8] [--held-out 16]

PP-OCR: the widths are chosen on `--samples` lines of text drawn by tests/trained_models.py (seed
0), the model's own inputs, given as `inputs=`; the output error (relative Frobenius of the
softmax output) and the text read are also measured on `--held-out` other lines (seed 1), which
the allocation never saw.  MiniLM: chosen on the first `--samples` (up to 32) of
trained_models.SENTENCES, held out on its last 16, each sentence a feed of its own (no padding);
the output error is the relative Frobenius of the sentence embeddings (all sentences' together)
and the mean cosine between each sentence's quantized and float embedding.  Times are one run
each, with the machine and its load.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import dyndq  # noqa: E402
import trained_models as tm  # noqa: E402
from bench_quantize import machine  # noqa: E402  (this script's folder is on sys.path)
from dyndq.runner import Runner  # noqa: E402

OUTPUT = "softmax_11.tmp_0"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--model", choices=("ppocr", "minilm"), default="ppocr")
    args = p.parse_args(argv)
    if args.model == "minilm":
        return minilm(args)
    if tm.missing():
        print(tm.missing())
        return 1
    print(f"machine: {machine()}")
    rec = dyndq.load_model(tm.path_of("ppocr_rec"))
    _, feeds = tm.recognizer_inputs(seed=0, count=args.samples)
    _, held = tm.recognizer_inputs(seed=1, count=args.held_out)
    chars = tm.characters(rec)
    float_run = Runner(rec, "onnxruntime")
    want = [float_run(f)[OUTPUT] for f in held]
    del float_run

    def held_out(model):
        run = Runner(model, "onnxruntime")
        got = [run(f)[OUTPUT] for f in held]
        e = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
        n = sum(float(np.sum(w.astype(np.float64) ** 2)) for w in want)
        same = sum(tm.decoded(g, chars) == tm.decoded(w, chars) for g, w in zip(got, want))
        return float(np.sqrt(e / n)), same

    rows, elements, bits = uniform_and_budgets(rec, feeds)
    print(f"PP-OCRv4 recognizer: {len(rows[0][3].layers)} MatMul weights ({elements} elements) quantized; budget = uniform 4-bit "
          f"search's {bits:.4f} bits per weight; chosen on {args.samples} lines, held out {args.held_out}")
    print(f"  {'':34s} {'time':>7s}  {'bits/w':>6s}  {'bytes':>7s}  output rel.: chosen on / held out  "
          f"held-out text as the float model's")
    for label, seconds, model, report in rows:
        rel, same = held_out(model)
        print(f"  {label:34s} {seconds:6.1f}s  {8 * report.bytes_after / elements:6.4f}  {report.bytes_after:7d}  "
              f"{report.outputs[0].relative_error:.4f} / {rel:.4f}  {same} of {len(held)}")
        if report.budget is not None:
            picks = ", ".join(f"{w.name} {w.candidates[w.chosen].choice}" for w in report.budget.weights)
            print(f"  {'':34s} kept: {report.budget.kept}; {picks}")
    return 0


def uniform_and_budgets(model, feeds) -> tuple[list, int, float]:
    """([(label, seconds, quantized model, report)], elements quantized, bits per weight): uniform
    4-bit search chosen on `feeds`, then `--budget` at its bits per weight with int2/int4/int8, and
    with mxfp4 among them too."""
    t = time.perf_counter()
    uniform, u = dyndq.quantize(model, method="search", inputs=feeds)
    rows = [("dyndq search, 4 bits", time.perf_counter() - t, uniform, u)]
    elements = sum(int(np.prod(layer.shape)) for layer in u.layers)
    bits = 8 * u.bytes_after / elements
    for choices in ("int2,int4,int8", "int2,int4,int8,mxfp4"):
        t = time.perf_counter()
        out, report = dyndq.quantize(model, method="search", inputs=feeds, budget=bits, format_choices=choices)
        rows.append((f"dyndq --budget ({choices})", time.perf_counter() - t, out, report))
    return rows, elements, bits


def minilm(args) -> int:
    if tm.minilm_missing():
        print(tm.minilm_missing())
        return 1
    if not 0 < args.samples <= 32 or not 0 < args.held_out <= 16:
        print("--samples: 1 to 32 sentences, --held-out: 1 to 16 (trained_models.SENTENCES)")
        return 2
    print(f"machine: {machine()}")
    model = dyndq.load_model(tm.path_of("minilm"))
    feeds = tm.minilm_inputs("chosen", args.samples)
    held = tm.minilm_inputs("held", args.held_out)
    float_run = Runner(model, "onnxruntime")
    want = {"chosen": [float_run(f)[tm.MINILM_OUTPUT] for f in feeds],
            "held": [float_run(f)[tm.MINILM_OUTPUT] for f in held]}
    del float_run
    layer_of = {i: n.name for n in model.graph.node for i in n.input}  # weight -> the node reading it

    def errors(quantized):
        """{part: (relative Frobenius of the sentence embeddings, mean cosine)} on both parts."""
        run = Runner(quantized, "onnxruntime")
        out = {}
        for part, part_feeds in (("chosen", feeds), ("held", held)):
            got = np.concatenate([run(f)[tm.MINILM_OUTPUT] for f in part_feeds]).astype(np.float64)
            ref = np.concatenate(want[part]).astype(np.float64)
            cosine = np.sum(got * ref, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
            out[part] = (float(np.linalg.norm(got - ref) / np.linalg.norm(ref)), float(cosine.mean()))
        return out

    rows, elements, bits = uniform_and_budgets(model, feeds)
    print(f"all-MiniLM-L6-v2: {len(rows[0][3].layers)} weights ({elements} elements: MatMul B and Gather tables, groups of "
          f"128) quantized; budget = uniform 4-bit search's {bits:.4f} bits per weight; chosen on {len(feeds)} "
          f"sentences, held out {len(held)}")
    print(f"  {'':34s} {'time':>7s}  {'bits/w':>6s}  {'bytes':>8s}  rel. Frobenius: chosen on / held out   "
          f"mean cosine: chosen on / held out")
    base = None
    for label, seconds, quantized, report in rows:
        e = errors(quantized)
        base = base or e
        gain = "" if e is base else (f"   error against uniform search's: {e['chosen'][0] / base['chosen'][0] - 1:+.1%} "
                                     f"chosen on, {e['held'][0] / base['held'][0] - 1:+.1%} held out")
        print(f"  {label:34s} {seconds:6.1f}s  {8 * report.bytes_after / elements:6.4f}  {report.bytes_after:8d}  "
              f"{e['chosen'][0]:.4f} / {e['held'][0]:.4f}{'':17s} {e['chosen'][1]:.6f} / {e['held'][1]:.6f}{gain}")
        if report.budget is not None:
            counts = {}
            for w in report.budget.weights:
                counts[w.candidates[w.chosen].choice] = counts.get(w.candidates[w.chosen].choice, 0) + 1
            print(f"  {'':34s} kept: {report.budget.kept}; {', '.join(f'{n} {c}' for c, n in sorted(counts.items()))}")
            for w in report.budget.weights:
                c = w.candidates[w.chosen]
                print(f"  {'':36s} {c.choice:5s} {layer_of.get(w.name, w.name)} ({w.elements} elements, {c.error:.3g} alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
