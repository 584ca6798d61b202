"""`dyndq import-weights`: a quantized checkpoint's weights put onto the float ONNX model, exactly
(dyndq.import_weights, docs/import.md).  Its errors (a tensor whose shape fits not its weight,
nothing matched, a --names entry naming nothing) are told by the one mapping, dyndq.cli.exits."""
from __future__ import annotations

import json

from dyndq.cli.common import Command, data_notes, emit_help, refuse_same_file
from dyndq.cli.exits import OK, UsageError


def _add_parser(sub) -> None:
    from dyndq.converters.rules import TARGETS

    p = sub.add_parser("import-weights", help="put a quantized checkpoint's weights (GGUF) onto the float ONNX model, exactly",
                       description="Write OUT: MODEL with its float weights replaced by the checkpoint's quantized "
                                   "tensors, each decoded by DynamicDequantize and standard ops to exactly the format's "
                                   "own dequantization. Tensors are matched to weights by name, by the format's name "
                                   "map (GGUF's TensorNameMap, llama.cpp's Q/K row permutation undone), by --names, "
                                   "then by shape and closeness to the float weights. Prints each weight imported, "
                                   "each left float and each checkpoint tensor unused. Exit 1 on problems (nothing "
                                   "matched, a tensor whose shape fits not its weight).")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("-o", "--output", metavar="OUT.onnx", required=True)
    p.add_argument("--names", metavar="MAP.json", help="a JSON object {checkpoint tensor: initializer name}")
    p.add_argument("--emit", choices=("dyndq", *TARGETS), default="dyndq",
                   help=emit_help())
    p.add_argument("--fuse", choices=("exact", "never"), default="exact",
                   help="with --emit onnxruntime: 'exact' (the default) writes MatMulNBits/GatherBlockQuantized "
                        "wherever they give the format's bits (fast; GGUF Q4_0 at 1.00x its bytes, its float16 scales "
                        "read as float32 through a Cast), 'never' every weight as the composition (the checkpoint's "
                        "own bytes)")
    p.add_argument("--no-unpermute", dest="unpermute", action="store_false",
                   help="leave a GGUF file's Q/K rows as stored (llama.cpp's rotary row permutation not undone: "
                        "for a checkpoint converted as llama that was never permuted, Mistral's own format)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_import_weights(args) -> int:
    from dyndq.checkpoints import MissingExtra, import_file

    refuse_same_file(args.model, args.output)
    try:
        report = import_file(args.model, args.checkpoint, args.output, names=args.names, emit=args.emit,
                             unpermute=args.unpermute, fuse=args.fuse)
    except MissingExtra as e:  # (an optional extra not installed: gguf)
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps({"input": args.model, "output": args.output, **report.as_dict()}, indent=2))
    else:
        print(f"wrote {args.output}: {report.summary()}")
        for note in data_notes(report.data_file, []):
            print(note)
        print("\n".join(report.table()))
    return OK


IMPORT_WEIGHTS = Command("import-weights", _add_parser, cmd_import_weights, subject="model")
