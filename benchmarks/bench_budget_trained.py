"""`quantize --budget` on a trained model: PP-OCR's text recognizer (tests/trained_models.py; `make
test-models` fetches it), beside uniform 4-bit search at the same bits per weight.

    .venv/bin/python benchmarks/bench_budget_trained.py [--samples 8] [--held-out 16]

The widths are chosen on `--samples` lines of text drawn by tests/trained_models.py (seed 0), the
model's own inputs, given as `inputs=`; the output error (relative Frobenius of the softmax
output) and the text read are also measured on `--held-out` other lines (seed 1), which the
allocation never saw.  Times are one run each, with the machine and its load.
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
    args = p.parse_args(argv)
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

    t = time.perf_counter()
    uniform, u = dyndq.quantize(rec, method="search", inputs=feeds)
    seconds = time.perf_counter() - t
    elements = sum(int(np.prod(layer.shape)) for layer in u.layers)
    bits = 8 * u.bytes_after / elements
    print(f"PP-OCRv4 recognizer: {len(u.layers)} MatMul weights ({elements} elements) quantized; budget = uniform 4-bit "
          f"search's {bits:.4f} bits per weight; chosen on {args.samples} lines, held out {args.held_out}")
    print(f"  {'':34s} {'time':>7s}  {'bits/w':>6s}  {'bytes':>7s}  output rel.: chosen on / held out  "
          f"held-out text as the float model's")
    rows = [("dyndq search, 4 bits", seconds, uniform, u)]
    for choices in ("int2,int4,int8", "int2,int4,int8,mxfp4"):
        t = time.perf_counter()
        out, report = dyndq.quantize(rec, method="search", inputs=feeds, budget=bits, format_choices=choices)
        rows.append((f"dyndq --budget ({choices})", time.perf_counter() - t, out, report))
    for label, seconds, model, report in rows:
        rel, same = held_out(model)
        print(f"  {label:34s} {seconds:6.1f}s  {8 * report.bytes_after / elements:6.4f}  {report.bytes_after:7d}  "
              f"{report.outputs[0].relative_error:.4f} / {rel:.4f}  {same} of {len(held)}")
        if report.budget is not None:
            picks = ", ".join(f"{w.name} {w.candidates[w.chosen].choice}" for w in report.budget.weights)
            print(f"  {'':34s} kept: {report.budget.kept}; {picks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
