"""How many of oneDNN's upstream benchdnn graphs import, check, run on both engines and agree.

    .venv/bin/python benchmarks/onednn_upstream.py [FOLDER or FILE ...]

For each oneDNN graph JSON below the FOLDERs, and each FILE, (by default tests/data/onednn/upstream and the
12 anchors of tests/data/onednn, the gated MLP's run taking about 3 GB): `dyndq.onednn.load`, `dyndq.check`, example inputs
(`onednn.example_inputs`, seed 0), a run on the reference engine and on ONNX Runtime, and a
comparison of every output: integer and bool outputs to the bit, float outputs within
TOLERANCE (of the output's dtype) times their largest magnitude, with NaN and infinities at
the same places.  Prints one line per graph (ok, or the step that failed and why) and the
count.  Exit code 0 when every graph passes.

The graphs are those of `tests/benchdnn/inputs/graph/` in uxlfoundation/oneDNN that this
repository holds a copy of (tests/data/onednn/upstream/README.md says which, and from where;
its MANIFEST.tsv gives the verdict of every upstream graph read, copied or not).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "onednn"
FOLDERS = [DATA / "upstream", DATA / "op", DATA / "complex_fusion"]

# max |reference - onnxruntime| <= TOLERANCE[dtype] * max |reference|: the engines sum MatMul,
# Softmax and ReduceSum in their own orders, so an intermediate rounded to f16/bf16 now and then
# lands on the other neighbour; a few units in the last place of the output's dtype at its top.
TOLERANCE = {"float32": 2.0**-16, "float16": 2.0**-9, "bfloat16": 2.0**-6,
             "float8_e4m3fn": 2.0**-2, "float8_e5m2": 2.0**-1}


def agree(name: str, ref: np.ndarray, ort: np.ndarray) -> str | None:
    """None when the outputs agree, else why not."""
    if ref.dtype != ort.dtype or ref.shape != ort.shape:
        return f"{name}: {ort.dtype}{list(ort.shape)} from onnxruntime, {ref.dtype}{list(ref.shape)} from reference"
    if ref.dtype.name not in TOLERANCE:
        return None if np.array_equal(ref, ort) else f"{name}: integer or bool outputs differ"
    a, b = ref.astype(np.float64), ort.astype(np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)) or not np.array_equal(a[np.isinf(a)], b[np.isinf(a)]):
        return f"{name}: NaN or infinities at different places"
    finite = np.isfinite(a)
    if not finite.any():
        return None
    top = np.abs(a[finite]).max()
    diff = np.abs(a[finite] - b[finite]).max()
    bound = TOLERANCE[ref.dtype.name] * top
    return None if diff <= bound else f"{name}: differs by {diff:.3g}, over {bound:.3g} ({TOLERANCE[ref.dtype.name]:.3g} x {top:.3g})"


def judge(path: Path) -> tuple[str, str]:
    """(step, detail): step "ok" when the graph passes every step, else the step that failed."""
    import dyndq
    from dyndq import onednn
    from dyndq.runner import clear_cache

    clear_cache()  # the engines built for the last graph: one graph's memory at a time
    try:
        model, report = onednn.load(path)
    except dyndq.ValidationError as e:
        return "load", str(e).splitlines()[-1] if len(e.problems) > 1 else str(e)
    problems = dyndq.check(model)
    if problems:
        return "check", str(problems[0])
    try:
        feeds = onednn.example_inputs(model, seed=0)
    except dyndq.ValidationError as e:
        return "example_inputs", str(e)
    try:
        with np.errstate(all="ignore"):
            ref = dyndq.run(model, feeds)
            ort = dyndq.run(model, feeds, engine="onnxruntime")
    except Exception as e:  # what either engine says, as it says it
        return "run", f"{type(e).__name__}: {str(e)[:200]}"
    for name in ref:
        why = agree(name, np.asarray(ref[name]), np.asarray(ort[name]))
        if why:
            return "agree", why
    bad = {n: int((~np.isfinite(v.astype(np.float64))).sum()) for n, v in ref.items() if v.dtype.kind == "f" or
           v.dtype.name in TOLERANCE}
    bad = {n: k for n, k in bad.items() if k}
    if bad:
        return "finite", f"non-finite outputs: {bad}"
    return "ok", report.summary()


def main(argv: list[str]) -> int:
    paths = sorted(p for where in ([Path(a) for a in argv] or FOLDERS)
                   for p in ([where] if where.is_file() else where.rglob("*.json")))
    passed = 0
    for path in paths:
        start = time.perf_counter()
        step, detail = judge(path)
        passed += step == "ok"
        where = path.relative_to(DATA) if path.is_relative_to(DATA) else path
        print(f"{'ok' if step == 'ok' else 'FAILED at ' + step}: {where} ({time.perf_counter() - start:.1f} s): {detail}")
    print(f"{passed} of {len(paths)} upstream graphs import, check, run on both engines and agree")
    return 0 if passed == len(paths) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
