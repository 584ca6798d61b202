"""`dyndq quantize`: weight-only quantization of a float model (dyndq.quantize, docs/quantize.md).

Its errors (a bad option value, nothing to quantize, --strict with a weight left alone) are
told by the one mapping, dyndq.cli.exits."""
from __future__ import annotations

import json
import sys

from dyndq.cli.common import Command, data_notes, say_saved
from dyndq.cli.exits import OK


def _add_parser(sub) -> None:
    from dyndq.quantization import EMITS, FORMATS, METHODS, OPS, SCALE_DTYPES

    q = sub.add_parser("quantize", help="weight-only quantization of a float model (int2/int4/int8 per group, MXFP4, NVFP4)",
                       description="Write OUT: IN with the constant weights of MatMul, Gemm and Gather as int2/int4/int8 "
                                   "codes with per-group scales, or as MXFP4 or NVFP4, feeding DynamicDequantize "
                                   "(docs/quantize.md). Prints a "
                                   "table: per weight its form and error, the sizes, the output error on seeded random "
                                   "inputs, and the weights left alone. Exit 1 when nothing could be quantized.")
    q.add_argument("input", metavar="IN")
    q.add_argument("output", metavar="OUT")
    q.add_argument("--format", choices=FORMATS, default="int",
                   help="int: integer codes of --bits bits (default); mxfp4: float4e2m1 codes, float8e8m0 scales per 32; "
                        "nvfp4: float4e2m1 codes, float8e4m3fn scales per 16 times a float32 tensor scale")
    q.add_argument("--bits", type=int, choices=(2, 4, 8), default=4, help="2, 4 (default) or 8 (--format int)")
    q.add_argument("--budget", type=float, metavar="BITS",
                   help="mixed formats: the average bits per weight (codes, scales and zero points over the weights "
                        "quantized) the model may hold; each weight's format is chosen among --format-choices for "
                        "the least output error (docs/quantize.md)")
    q.add_argument("--format-choices", metavar="F,F",
                   help="with --budget: what it chooses among, of int2,int4,int8,mxfp4,nvfp4 (default int2,int4,int8)")
    q.add_argument("--group-size", type=int, metavar="N",
                   help="elements per group along the reduction axis (default 128; mxfp4 and nvfp4: their blocks, "
                        "32 and 16, and no other); -1: one per whole axis (per channel)")
    q.add_argument("--symmetric", action="store_true", help="signed codes, no zero points")
    q.add_argument("--scale-dtype", choices=SCALE_DTYPES, help="the scales' dtype (default: each weight's own)")
    q.add_argument("--method", choices=METHODS, default="rtn",
                   help="rtn: ONNX Runtime's rounding (default); search: a per-group search, lower error")
    q.add_argument("--ops", default=",".join(OPS), metavar="OP,OP", help=f"the ops whose weights to quantize (default {','.join(OPS)})")
    q.add_argument("--exclude", action="append", default=[], metavar="NAME", help="a node or weight to leave alone (repeat)")
    q.add_argument("--emit", choices=EMITS, default="dyndq",
                   help="dyndq: DynamicDequantize (default); onnx: standard ONNX; onnxruntime: its contrib ops; "
                        "onednn-json: a oneDNN graph, its weights as .npy files in OUT's name + -weights")
    q.add_argument("--seed", type=int, default=0, help="the seed of the random inputs the output error is measured on (default 0)")
    q.add_argument("--no-evaluate", action="store_true", help="do not run the models to measure the output error")
    q.add_argument("--strict", action="store_true", help="exit 1, writing nothing, when any weight of those ops is left alone")
    q.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_quantize(args) -> int:
    from dyndq.quantization import quantize_file

    def progress(line: str) -> None:  # on a terminal only: quiet when piped or captured
        print(line, file=sys.stderr, flush=True)

    # a bad option value (OptionError), nothing to quantize (NothingToQuantize), and --strict with a weight
    # left alone (ValidationError) are told by the one mapping
    report = quantize_file(
        args.input, args.output, emit=args.emit, evaluate=False if args.no_evaluate else None, seed=args.seed,
        strict=args.strict, progress=progress if sys.stderr.isatty() else None,
        save_weights=lambda written: [say_saved(p, v, raw_bytes_note=not args.json) for p, v in written.items()],
        bits=args.bits, group_size=args.group_size, symmetric=args.symmetric, scale_dtype=args.scale_dtype,
        ops=[op for op in args.ops.split(",") if op], exclude=args.exclude, method=args.method, format=args.format,
        budget=args.budget, format_choices=args.format_choices)
    if args.no_evaluate:
        report.outputs_note = "not measured (--no-evaluate)"
    if args.json:
        print(json.dumps({"input": args.input, "output": args.output, "emit": args.emit, **report.as_dict()}, indent=2))
    else:
        print(f"wrote {args.output}: {report.summary()}")
        for note in data_notes(report.data_file, report.kept_files):
            print(note)
        print("\n".join(report.table()))
    return OK


QUANTIZE = Command("quantize", _add_parser, cmd_quantize, subject="input")
