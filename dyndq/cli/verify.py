"""`dyndq verify`: a quantized ONNX model checked against its source, weight by weight and output
by output on each engine setting asked (dyndq.verify, docs/verify.md).  Exit 0 when every weight
is faithful (identical, round to nearest, or left float with the source's values), every output
within --tolerance and no engine setting moves the outputs more than the float model's, 1 on
findings, 2 on usage."""
from __future__ import annotations

import json

import numpy as np

from dyndq.cli.common import Command
from dyndq.cli.run import input_samples
from dyndq.cli.exits import OK, PROBLEMS, UsageError


# (dyndq.verification.TOLERANCE and blame.TOP, written here: importing the package would read the
# checkpoint readers at every command's start; tests/cli/test_verify.py holds the two equal)
TOLERANCE_SAID, TOP_SAID = "0.5", "10"


def _add_parser(sub) -> None:
    from dyndq.ort_session import LEVELS
    from dyndq.runner import SESSIONS as ENGINES  # (verification.settings' engines, without importing verify)

    p = sub.add_parser("verify", help="check a quantized model against its float model or checkpoint, weight by weight",
                       description="Match each quantized weight of QUANTIZED (our DynamicDequantize, DequantizeLinear, "
                                   "MatMulNBits, GatherBlockQuantized) to its tensor in SOURCE (a float ONNX model, a "
                                   ".gguf file, a safetensors checkpoint) and say what it is: identical, rtn (ONNX "
                                   "Runtime's round to nearest, the rule named), requantized, layout (with its kind), "
                                   "differs, unmatched, float. With an ONNX SOURCE, also compare the outputs on the "
                                   "engine settings asked, each held to --tolerance, say which weights moved them "
                                   "(--blame), and pin a setting whose outputs move more than the float model's on "
                                   "the rewrite, accuracy_level or setting responsible and the first node. Exit 0 when "
                                   "every weight is faithful, every output within the tolerance and no setting is "
                                   "found, 1 on findings (docs/verify.md).")
    p.add_argument("quantized", metavar="QUANTIZED.onnx")
    p.add_argument("--against", required=True, metavar="SOURCE", help="the float ONNX model, .gguf or safetensors "
                                                                        "checkpoint QUANTIZED was made from")
    p.add_argument("--input", "-i", metavar="NAME=FILE.npy", action="append", default=[],
                   help="compare the outputs on this input (repeat for each graph input)")
    p.add_argument("--inputs-dir", metavar="DIR", action="append", default=[],
                   help="one sample: each graph input from DIR/NAME.npy; repeat for several samples")
    p.add_argument("--samples", type=int, default=4, metavar="N",
                   help="without --input/--inputs-dir: the number of seeded samples (default 4)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the seeded samples (default 0)")
    p.add_argument("--weights-only", action="store_true", help="compare the weights only, not the outputs")
    p.add_argument("--engine", choices=ENGINES, action="append", metavar="ENGINE",
                   help=f"an engine the outputs are compared on ({', '.join(ENGINES)}; repeat for more; default: "
                        "reference and onnxruntime; the reference engine always runs: the others are judged "
                        "against it)")
    p.add_argument("--level", choices=LEVELS, action="append", metavar="LEVEL",
                   help=f"an ONNX Runtime optimization level compared ({', '.join(LEVELS)}; repeat for more; "
                        "default: basic)")
    p.add_argument("--tolerance", metavar="REL", default=None,
                   help="an output whose relative error ||q - f|| / ||f|| is above REL on any engine is a finding "
                        f"(default {TOLERANCE_SAID}; docs/verify.md says why)")
    p.add_argument("--blame", action="store_true",
                   help="rank the weights by the output error each gives alone in the float source, even when "
                        "every output is within the tolerance (one run of the float model per weight)")
    p.add_argument("--blame-top", type=int, default=None, metavar="N",
                   help=f"keep the N weights most to blame (default {TOP_SAID})")
    p.add_argument("--json", action="store_true", help="print the report as JSON (docs/verify.md's schema)")


def cmd_verify(args) -> int:
    from dyndq.verification import verify
    from dyndq.verification.settings import SettingRefused

    if args.samples < 1:
        raise UsageError(f"--samples {args.samples}: a whole number >= 1")
    if args.weights_only and (args.input or args.inputs_dir):
        raise UsageError("--input and --inputs-dir are for comparing the outputs; --weights-only compares none")
    if (args.engine or args.level) and (args.weights_only or not args.against.lower().endswith(".onnx")):
        raise UsageError("--engine and --level are for comparing the outputs, which only a float ONNX SOURCE "
                         "without --weights-only has")
    tolerance = _tolerance(args.tolerance)
    if args.blame_top is not None and args.blame_top < 1:
        raise UsageError(f"--blame-top {args.blame_top}: a whole number >= 1")
    if args.blame and args.weights_only:
        raise UsageError("--blame runs the float source on the inputs; --weights-only runs nothing")
    if args.blame and not args.against.lower().endswith(".onnx"):
        raise UsageError(f"--blame runs the float source: {args.against} is a checkpoint, not an ONNX model to run")
    inputs = None if args.weights_only else input_samples(args, args.against) if args.against.lower().endswith(".onnx") \
        else None
    try:  # (verify checks the engines and levels first, before any work: its refusal is a usage error)
        report = verify(args.quantized, args.against, inputs=inputs, samples=args.samples, seed=args.seed,
                        outputs=not args.weights_only, engines=args.engine, levels=args.level, tolerance=tolerance,
                        blame=True if args.blame else None, blame_top=args.blame_top)
    except SettingRefused as e:  # (an engine asked for that is not installed among them)
        raise UsageError(f"--engine/--level: {e}") from None
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
        print("\n".join(report.table()))
    return OK if report.faithful else PROBLEMS


def _tolerance(text: str | None) -> float:
    from dyndq.verification import TOLERANCE

    if text is None:
        return TOLERANCE
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and value >= 0):
        raise UsageError(f"--tolerance {text}: a relative error, a finite number >= 0 (e.g. 0.5)")
    return value


VERIFY = Command("verify", _add_parser, cmd_verify, subject="quantized")
