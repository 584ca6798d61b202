"""oneDNN Graph's JSON in and out: `dyndq import-onednn` and `dyndq export-onednn` (dyndq.onednn)."""
from __future__ import annotations

import os

import numpy as np

from dyndq.cli.common import Command, load, output_files, refuse_same_file, say_saved
from dyndq.cli.exits import OK, UsageError


def _add_import(sub) -> None:
    i = sub.add_parser("import-onednn", help="a oneDNN Graph JSON as an ONNX model",
                       description="Write OUT.onnx: the oneDNN graph (benchdnn JSON, oneDNN's graph dump) as ONNX "
                                   "holding DynamicDequantize and standard ops. Exit 1 with every problem when an "
                                   "op cannot be mapped.")
    i.add_argument("graph", metavar="GRAPH.json")
    i.add_argument("output", metavar="OUT.onnx")
    i.add_argument("--inputs-dir", metavar="DIR", help="also write one example NAME.npy per graph input into DIR")
    i.add_argument("--seed", type=int, default=0, help="the seed of the example inputs (default 0)")
    i.add_argument("--max-input-bytes", type=int, default=None, metavar="N",
                   help="refuse example inputs over N bytes together (default 4 GiB)")


def cmd_import_onednn(args) -> int:
    from dyndq import onednn
    from dyndq.model_files import save_model
    from dyndq.atomic_writes import write_together

    from dyndq.written import verify_model

    if not os.path.isfile(args.graph):
        raise UsageError(f"{args.graph}: no such file")
    refuse_same_file(args.graph, args.output)
    if args.seed < 0:
        raise UsageError(f"--seed {args.seed}: a whole number >= 0")
    if args.max_input_bytes is not None and args.max_input_bytes < 0:
        raise UsageError(f"--max-input-bytes {args.max_input_bytes}: a whole number of bytes >= 0")
    model, report = onednn.load(args.graph)  # an op that cannot be mapped: a ValidationError
    arrays = None
    if args.inputs_dir:  # made before anything is written: OUT and DIR only when every step succeeded
        budget = {} if args.max_input_bytes is None else {"max_bytes": args.max_input_bytes}
        arrays = onednn.example_inputs(model, args.seed, **budget)
    files = output_files(args.inputs_dir, arrays) if arrays is not None else []
    # (the model checked before it is put in place: valid, and it loads on the reference engine)
    def check(staged, folder=None):
        verify_model(staged, "dyndq", shown_as=args.output)

    try:
        if arrays is None:
            save_model(model, args.output, check=check)
        else:  # the model and its example inputs all or nothing
            write_together(args.output, lambda f: f.write(model.SerializeToString()), args.inputs_dir,
                           {os.path.basename(path): (lambda f, v=value: np.save(f, v, allow_pickle=False))
                            for _, path, value in files}, check=check)
    except OSError as e:
        raise UsageError(str(e)) from None
    print(f"wrote {args.output}: {report.summary()}")
    for note in report.notes:
        print(f"  note: {note}")
    for label, path, value in files:
        say_saved(path, value, label, raw_bytes_note=True)
    return OK


def _add_export(sub) -> None:
    x = sub.add_parser("export-onednn", help="an ONNX model as a oneDNN Graph JSON",
                       description="Write OUT.json: MODEL as a oneDNN graph (3.x format). Exit 1 with every "
                                   "problem when oneDNN cannot express it.")
    x.add_argument("model", metavar="MODEL.onnx")
    x.add_argument("output", metavar="OUT.json")
    x.add_argument("--weights-as-inputs", action="store_true",
                   help="make each initializer an op takes an input port (property_type constant) and write "
                        "its array as NAME.npy into OUT-weights/ beside OUT.json")


def cmd_export_onednn(args) -> int:
    from dyndq import onednn

    from dyndq.written import verify_onednn_json

    refuse_same_file(args.model, args.output)
    loaded = load(args.model)
    weights: dict = {}
    doc = onednn.dump(loaded.model, weights_as_inputs=args.weights_as_inputs, weights=weights)
    # the JSON and its weights (OUT-weights/NAME.npy) all or nothing, read back by dyndq's reader before they are
    # put in place
    written = onednn.save_json(doc, args.output, weights, check=lambda staged, folder: verify_onednn_json(
        staged, folder, list(weights), shown_as=args.output))
    print(f"wrote {args.output}: {len(doc['graph'])} oneDNN ops, "
          f"{len(doc['input_ports'])} input ports, {len(doc['output_ports'])} output ports")
    for path, value in written.items():
        say_saved(path, value, raw_bytes_note=True)
    return OK


IMPORT = Command("import-onednn", _add_import, cmd_import_onednn, subject="graph")
EXPORT = Command("export-onednn", _add_export, cmd_export_onednn, subject="model")
