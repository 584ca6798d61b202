"""A budget whose candidates are made by each method, against uniform 4 bits of the same method.

    .venv/bin/python benchmarks/bench_budget_methods.py [--model minilm|ppocr|all] [--budget 4.5] [--samples 16] [--held-out 16]

The models, groups, calibration inputs and held-out inputs are bench_data_aware.py's (`minilm_case`,
`ppocr_case`: the same prepared model, MatMul weights only, the same group); the budget chooses among
int2, int4, int8 on the calibration inputs, and every error is measured on the held-out ones (the
relative Frobenius error of the output against the float model's, as bench_data_aware.py measures
it).  Rows: for each of `--methods` (default rtn, gptq, awq, the last two with and without scale estimation), uniform
4 bits and the budget; the bits per weight are the budget report's (codes, scales and zero points over
the weights quantized), the uniform model's counted the same way.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

METHODS = {"rtn": ("rtn", {}), "search": ("search", {}), "gptq": ("gptq", {}), "awq": ("awq", {}),
           "rtn+se": ("rtn", {"scale_estimation": True}), "gptq+se": ("gptq", {"scale_estimation": True}),
           "awq+se": ("awq", {"scale_estimation": True})}


def error_of(out, case, want) -> float:
    from bench_data_aware import held_out_outputs

    got = held_out_outputs(out, case)
    e = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
    return float(np.sqrt(e / sum(float(np.sum(w.astype(np.float64) ** 2)) for w in want)))


def run(case, budget: float, methods: list[str]) -> list[str]:
    import dyndq
    from dyndq.runner import Runner

    float_run = Runner(case.model, "onnxruntime")
    want = [float_run(f)[case.output] for f in case.held]
    del float_run
    common = dict(group_size=case.group, ops=("MatMul",), exclude=case.excluded, inputs=case.calibration,
                  evaluate=False)
    lines = [f"### {case.title}: budget {budget:g} against uniform 4 bits, held-out error", "",
             "| method | uniform int4 | b/w | budget | b/w | budget / uniform | widths chosen | time (budget) |",
             "|---|---|---|---|---|---|---|---|"]
    for method, more in (METHODS[m] for m in methods):
        label = method + (" + SE" if more else "")
        uniform, ur = dyndq.quantize(case.model, bits=4, method=method, **common, **more)
        started = time.perf_counter()
        mixed, mr = dyndq.quantize(case.model, budget=budget, method=method, **common, **more)
        seconds = time.perf_counter() - started
        eu, em = error_of(uniform, case, want), error_of(mixed, case, want)
        widths = {}
        for w in mr.budget.weights:
            c = w.candidates[w.chosen].choice
            widths[c] = widths.get(c, 0) + 1
        shown = ", ".join(f"{n} {c}" for c, n in sorted(widths.items()))
        ubits = 8 * ur.bytes_after / sum(int(np.prod(layer.shape)) for layer in ur.layers)
        lines.append(f"| {label} | {eu:.4f} | {ubits:.3f} | {em:.4f} | {mr.budget.bits_per_weight:.3f} | "
                     f"{em / eu:.3f}x | {shown} | {seconds:.1f} s |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main(argv=None) -> int:
    from bench_data_aware import minilm_case, ppocr_case, synthetic_case

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("minilm", "ppocr", "synthetic", "all"), default="all")
    p.add_argument("--budget", type=float, default=4.5)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--held-out", type=int, default=16)
    p.add_argument("--methods", default="rtn,gptq,gptq+se,awq,awq+se", help=f"of {','.join(METHODS)}")
    args = p.parse_args(argv)
    makers = {"minilm": minilm_case, "ppocr": ppocr_case, "synthetic": synthetic_case}  # (synthetic: the smoke test's)
    for name in (["minilm", "ppocr"] if args.model == "all" else [args.model]):
        case = makers[name](args.samples, args.held_out)
        if isinstance(case, str):
            print(f"{name}: skipped ({case})")
            continue
        print("\n".join(run(case, args.budget, args.methods.split(','))) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
