"""Converting a model between forms: `dyndq export` (our op lowered to standard ONNX, or to ONNX
Runtime's contrib ops) and `dyndq lift` (DequantizeLinear, MatMulNBits, GatherBlockQuantized
lifted to our op)."""
from __future__ import annotations

from dyndq.cli.common import Command, load, refuse_same_file, save
from dyndq.cli.exits import OK, UsageError
from dyndq.converters.engines import ENGINES
from dyndq.converters.rules import TARGETS
from dyndq.wording import first_line


def _add_export(sub) -> None:
    e = sub.add_parser("export", help="lower every DynamicDequantize to standard ONNX",
                       description="Write OUT: IN with every DynamicDequantize lowered to standard ONNX operators.")
    e.add_argument("input", metavar="IN")
    e.add_argument("output", metavar="OUT")
    e.add_argument("--opset", metavar="N", type=int, help="the ai.onnx opset to write (default: the model's, raised if needed)")
    e.add_argument("--target", choices=TARGETS, default="onnx",
                   help="; ".join(f"{e.name}: {e.writes}" for e in ENGINES.values()) + " (default: onnx)")
    e.add_argument("--accuracy-level", metavar="N", type=int, choices=range(5),
                   help="with --target onnxruntime: the accuracy_level of every MatMulNBits written (default: what "
                        "a lifted node kept, else 0, the graph's float meaning; 4 quantizes the activations to int8)")
    e.add_argument("--overwrite", action="store_true", help="OUT may be IN itself, replaced (refused without it)")


def cmd_export(args) -> int:
    import dyndq
    from dyndq.exporter import export_with_report

    refuse_same_file(args.input, args.output, args.overwrite)
    loaded = load(args.input)
    if args.accuracy_level is not None and args.target != "onnxruntime":
        raise UsageError("--accuracy-level goes with --target onnxruntime (standard ONNX has no MatMulNBits)")
    try:
        out, report = export_with_report(loaded.model, opset=args.opset, target=args.target,
                                         accuracy_level=args.accuracy_level)
        loaded.model = None  # (the input's memory is free before the output is written: peak 2x, not 3x)
    except dyndq.ValidationError:  # problems in the model: told by the one mapping
        raise
    except ValueError as e:  # ExportError: e.g. --opset too low for the graph
        raise UsageError(f"{args.input}: {first_line(e)}") from None
    handed = [out]
    del out
    notes = save(handed, args.output, loaded, args.target)  # (checked: valid, and it loads on the target's engine)
    print(f"wrote {args.output}: {report.summary()}")
    for note in notes:
        print(note)
    for line in report.lines():
        print(f"  {line}")
    return OK


def _add_lift(sub) -> None:
    l = sub.add_parser("lift", help="turn DequantizeLinear, MatMulNBits and GatherBlockQuantized nodes into DynamicDequantize",
                       description="Write OUT: IN with every DequantizeLinear, com.microsoft::MatMulNBits and "
                                   "com.microsoft::GatherBlockQuantized that DynamicDequantize expresses exactly lifted to it.")
    l.add_argument("input", metavar="IN")
    l.add_argument("output", metavar="OUT")
    l.add_argument("--overwrite", action="store_true", help="OUT may be IN itself, replaced (refused without it)")


def cmd_lift(args) -> int:
    from dyndq.lifter import lift_with_report

    refuse_same_file(args.input, args.output, args.overwrite)
    loaded = load(args.input)
    out, report = lift_with_report(loaded.model)
    loaded.model = None  # (the input's memory is free before the output is written)
    opset_and_ir = _opset_and_ir(out)
    handed = [out]
    del out
    notes = save(handed, args.output, loaded, "dyndq")  # (checked: valid, and it loads on the reference engine)
    print(f"wrote {args.output}: {report.summary()}; {opset_and_ir}")
    for note in notes:
        print(note)
    for s in report.skipped:
        print(f"  {s}")
    for note in report.notes:
        print(f"  note: {note}")
    return OK


def _opset_and_ir(model) -> str:
    from dyndq.plumbing.opsets import ai_onnx_version

    opset = ai_onnx_version(model.opset_import)
    return f"ai.onnx opset {opset}, IR version {model.ir_version}"


EXPORT = Command("export", _add_export, cmd_export, subject="input")
LIFT = Command("lift", _add_lift, cmd_lift, subject="input")
