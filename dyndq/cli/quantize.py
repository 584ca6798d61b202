"""`dyndq quantize`: weight-only quantization of a float model (dyndq.quantize, docs/quantize.md).

Its errors (a bad option value, nothing to quantize, --strict with a weight left alone) are
told by the one mapping, dyndq.cli.exits."""
from __future__ import annotations

import json
import sys

from dyndq.cli.common import Command, data_notes, emit_help, refuse_same_file, say_saved
from dyndq.cli.run import input_samples
from dyndq.cli.exits import OK, UsageError


def _add_parser(sub) -> None:
    from dyndq.quantization import EMITS, METHODS, OPS, SCALE_DTYPES, formats

    q = sub.add_parser("quantize", help="weight-only quantization of a float model (int2/int4/int8 per group, MXFP4, NVFP4)",
                       description="Write OUT: IN with the constant weights of MatMul, Gemm and Gather as int2/int4/int8 "
                                   "codes with per-group scales, or as MXFP4 or NVFP4, feeding DynamicDequantize "
                                   "(docs/quantize.md). Prints a "
                                   "table: per weight its form and error, the sizes, the output error (on --input/--inputs-dir, "
                                   "or seeded samples; top-1 agreement and KL divergence for logits), and the weights "
                                   "left alone. Exit 1 when nothing could be quantized.")
    q.add_argument("input_", metavar="IN")
    q.add_argument("output", metavar="OUT")
    q.add_argument("--format", choices=formats.names(),  # (None: not given, which a --budget requires; int by default)
                   help="; ".join(f"{f}: {formats.get(f).summary}" + (" (default)" if i == 0 else "")
                                  for i, f in enumerate(formats.names())) + "; not with --budget")
    q.add_argument("--bits", type=int, choices=formats.all_bits(),  # (None: not given, which a --budget requires)
                   help=_bits_help(formats))
    q.add_argument("--budget", type=float, metavar="BITS",
                   help="mixed formats: the average bits per weight (codes, scales and zero points over the weights "
                        "quantized) the model may hold; each weight's format is chosen among --format-choices for "
                        "the least output error, its candidates made by --method (gptq, awq: calibrated once) and "
                        "--scale-estimation (docs/quantize.md)")
    q.add_argument("--format-choices", metavar="F,F",
                   help="with --budget: what it chooses among, of int2,int4,int8,mxfp4,nvfp4 (default int2,int4,int8)")
    q.add_argument("--group-size", type=int, metavar="N",
                   help="elements per group along the reduction axis (default 128; mxfp4 and nvfp4: their blocks, "
                        "32 and 16, and no other); -1: one per whole axis (per channel)")
    q.add_argument("--symmetric", action="store_true", help="signed codes, no zero points")
    q.add_argument("--scale-dtype", choices=SCALE_DTYPES, help="the scales' dtype (default: each weight's own)")
    q.add_argument("--method", choices=METHODS, default="rtn",
                   help="rtn: ONNX Runtime's rounding (default); search: a per-group search, lower error; gptq: "
                        "calibrated on --input/--inputs-dir (else --samples seeded samples), the error of each column "
                        "fed forward through the inverse Hessian of the layer's inputs; awq: calibrated so too, a scale per input "
                        "channel searched on the activations' magnitudes, divided out of the activation in the graph "
                        "(integer formats)")
    q.add_argument("--damping", type=float, metavar="F",
                   help="with --method gptq: added to the Hessian's diagonal, times its mean (default 0.01)")
    q.add_argument("--block-size", type=int, metavar="N", help="with --method gptq: columns per lazy batch (default 128)")
    q.add_argument("--act-order", action="store_true", default=None,
                   help="with --method gptq: round the columns by decreasing Hessian diagonal")
    q.add_argument("--calibration-memory", metavar="SIZE",
                   help="with --method gptq or --scale-estimation: the layer statistics (X^T X) held at once, e.g. 512MiB or 2GB; the "
                        "inputs are collected in as many passes over the samples as that takes (default: a quarter "
                        "of the model's weights, or one layer's statistics if more)")
    q.add_argument("--scale-estimation", action="store_true",
                   help="on top of --method (integer formats): each group's scale and zero point refitted to the "
                        "layer's output error on --input/--inputs-dir (else --samples seeded samples)")
    q.add_argument("--ops", default=",".join(OPS), metavar="OP,OP", help=f"the ops whose weights to quantize (default {','.join(OPS)})")
    q.add_argument("--exclude", action="append", default=[], metavar="NAME", help="a node or weight to leave alone (repeat)")
    q.add_argument("--emit", choices=EMITS, default="dyndq",
                   help=emit_help() + "; onednn-json: a oneDNN graph, its weights as .npy files in OUT's name + -weights")
    q.add_argument("--input", "-i", metavar="NAME=FILE.npy", action="append", default=[],
                   help="measure the output error on this input (repeat for each graph input): one sample, or the "
                        "same input in every --inputs-dir sample")
    q.add_argument("--inputs-dir", metavar="DIR", action="append", default=[],
                   help="one sample: each graph input from DIR/NAME.npy (as run --output-dir writes them); repeat for "
                        "several samples")
    q.add_argument("--samples", type=int, default=4, metavar="N",
                   help="without --input/--inputs-dir: the number of seeded samples to measure on (default 4)")
    q.add_argument("--seed", type=int, default=0, help="the seed of the seeded samples (default 0)")
    q.add_argument("--rank-methods", action="store_true",
                   help="also quantize with every method (the other options alike) and rank them by what a task would "
                        "see on the same inputs (the model written is --method's)")
    q.add_argument("--report", metavar="FILE", help="also write the report to FILE: JSON (.json) or Markdown (.md, with "
                                                   "a per-weight error chart FILE-errors.png where matplotlib is installed)")
    q.add_argument("--no-evaluate", action="store_true", help="do not run the models to measure the output error")
    q.add_argument("--strict", action="store_true", help="exit 1, writing nothing, when any weight of those ops is left alone")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.add_argument("--overwrite", action="store_true",
                   help="OUT may be IN itself: the float model is then replaced (refused without it)")


def _bits_help(formats) -> str:
    """--bits' help from the registry: each format of several widths, its default first in `bits`."""
    said = []
    for name in formats.names():
        bits = formats.get(name).bits
        if len(bits) > 1:
            words = [f"{b} (default)" if b == bits[0] else str(b) for b in sorted(bits)]
            said.append(f"{', '.join(words[:-1])} or {words[-1]} (--format {name})")
    return "; ".join(said) + "; not with --budget"


def cmd_quantize(args) -> int:
    import os

    from dyndq.quantization import quantize_file
    from dyndq.quantization.report import write_report

    from dyndq.atomic_writes import ModelFileError, check_target, same_file

    refuse_same_file(args.input_, args.output, args.overwrite)
    if args.report and os.path.splitext(args.report)[1].lower() not in (".json", ".md"):
        raise UsageError(f"--report {args.report}: a report is written as FILE.json or FILE.md")
    if args.report:
        for path, what in ((args.input_, "IN"), (args.output, "OUT")):
            if same_file(args.report, path):
                raise UsageError(f"--report {args.report}: is {what} itself; write the report to a file of its own")
        try:
            check_target(args.report)
        except ModelFileError as e:
            raise UsageError(f"--report {e}") from None
    from dyndq.quantization.numerics import DATA_AWARE

    calibrated = args.budget is not None or args.method in DATA_AWARE or args.scale_estimation  # (chosen on the inputs even when nothing is measured)
    if ((args.input or args.inputs_dir) and not calibrated or args.rank_methods) and args.no_evaluate:
        raise UsageError("--input, --inputs-dir and --rank-methods are for measuring the output error; "
                         "--no-evaluate measures none")
    inputs = input_samples(args, args.input_)
    options = dict(format=args.format, bits=args.bits, group_size=args.group_size, symmetric=args.symmetric, scale_dtype=args.scale_dtype,
                   ops=[op for op in args.ops.split(",") if op], exclude=args.exclude)
    options.update({key: value for key, value in (("damping", args.damping), ("block_size", args.block_size),
                                                  ("act_order", args.act_order),
                                                  ("calibration_memory", args.calibration_memory)) if value is not None})
    if args.scale_estimation:
        options.update(scale_estimation=True)
    if args.budget is not None or args.format_choices is not None:
        options.update(budget=args.budget, format_choices=args.format_choices)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    progress = say if sys.stderr.isatty() else None  # (on a terminal only: quiet when piped or captured)

    head = {"input": args.input_, "output": args.output, "emit": args.emit}
    if inputs is not None:  # (which files the samples came from)
        head["samples_from"] = [f"--inputs-dir {d}" for d in args.inputs_dir] + [f"--input {i}" for i in args.input]
    chart = None

    def before_placing(report) -> None:
        """The methods ranked and the report written while OUT is still staged: an error or Ctrl-C
        here leaves OUT as it was."""
        nonlocal chart
        if args.no_evaluate:
            report.outputs_note = "not measured (--no-evaluate)"
        if args.rank_methods:
            report.ranking, report.ranking_note = _ranked(args, inputs, progress, options)
        if args.report:
            chart = write_report(report, args.report, head)

    # a bad option value (OptionError), nothing to quantize (NothingToQuantize), and --strict with a weight
    # left alone (ValidationError) are told by the one mapping
    report = quantize_file(
        args.input_, args.output, emit=args.emit, evaluate=False if args.no_evaluate else None, seed=args.seed,
        inputs=inputs, samples=args.samples,
        strict=args.strict, progress=progress, overwrite=args.overwrite, before_placing=before_placing,
        save_weights=lambda written: [say_saved(p, v, raw_bytes_note=not args.json) for p, v in written.items()],
        method=args.method, **options)
    if args.json:
        print(json.dumps({**head, **report.as_dict()}, indent=2))
    else:
        print(f"wrote {args.output}: {report.summary()}")
        for note in data_notes(report.data_file, report.kept_files):
            print(note)
        print("\n".join(report.table()))
    if args.report:
        print(f"wrote {args.report}" + (f"; {chart}" if chart else ""), file=sys.stderr if args.json else sys.stdout)
    return OK


def _ranked(args, inputs, progress, options) -> tuple[list[dict], str | None]:
    """(--rank-methods' rows, None), or ([], why none) when the float model cannot run on the
    inputs (as the evaluation then says "not measured")."""
    from dyndq.model_files import load_model
    from dyndq.quantization import rank_methods
    from dyndq.quantization.evaluate import NotMeasured
    from dyndq.quantization.report import ranking_rows

    try:
        runs = rank_methods(load_model(args.input_), inputs=inputs, samples=args.samples, seed=args.seed,
                            progress=progress, **options)
    except NotMeasured as e:
        return [], f"not ranked: {str(e).removeprefix('not measured: ')}"
    if not any(report.task_score() for _, report in runs):  # (nothing measured: no rank to give)
        return [], f"not ranked: {runs[0][1].outputs_note.removeprefix('not measured: ')}"
    return ranking_rows(runs), None


QUANTIZE = Command("quantize", _add_parser, cmd_quantize, subject="input_")
