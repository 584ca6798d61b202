"""`dyndq run`: a model run on .npy inputs, on the reference engine or ONNX Runtime; its outputs
described (dyndq.arrays) or saved as .npy files (named by dyndq.npy.npy_files)."""
from __future__ import annotations

import os
import sys

import numpy as np

from dyndq.cli.common import Command, load, output_files, parse_inputs, say_saved
from dyndq.cli.exits import OK, ProblemsFound, UsageError
from dyndq.engine_failures import explained
from dyndq.wording import os_error, problem_list


def _add_parser(sub) -> None:
    from dyndq.runner import ENGINES

    r = sub.add_parser("run", help="run a model on .npy inputs",
                       description="Run MODEL's graph. Outputs are saved as OUTPUT_NAME.npy in --output-dir, "
                                   "or described (shape, dtype, summary) when no folder is given. An output that "
                                   "does not fit the type the graph declares for it (dtype, rank, a fixed dimension) "
                                   "is not shown: exit 1, naming it.")
    r.add_argument("model", metavar="MODEL")
    r.add_argument("--input", "-i", metavar="NAME=FILE.npy", action="append", default=[],
                   help="a graph input and the .npy file holding it (repeat for each input)")
    r.add_argument("--inputs-dir", metavar="DIR", action="append", default=[],
                   help="take each graph input from DIR/NAME.npy (as import-onednn --inputs-dir writes them; "
                        "repeat for several folders, the first holding a file wins); --input names one in "
                        "place of its file")
    r.add_argument("--engine", choices=ENGINES, default="reference",
                   help="reference: ONNX's reference evaluator with our kernel (default); "
                        "onnxruntime: export, then ONNX Runtime on the CPU")
    r.add_argument("--output", metavar="NAME", action="append", default=None, dest="outputs",
                   help="show (or save) this value of the main graph instead of the graph's outputs: a graph input, "
                        "an initializer or any node's output, ours included (repeat for several)")
    r.add_argument("--output-dir", metavar="DIR", help="save each output as DIR/NAME.npy")


def cmd_run(args) -> int:
    from dyndq.atomic_writes import check_writable, remove_empty_folders

    loaded = load(args.model)
    feeds = parse_inputs(args.input)
    if args.inputs_dir:
        feeds = {**inputs_from_dirs(args.inputs_dir, loaded.model, set(feeds)), **feeds}
    if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise UsageError(f"--output-dir {args.output_dir}: exists and is not a folder")
    created = check_writable(args.output_dir) if args.output_dir else []  # before the run, not after it
    code = None
    try:
        code = _run(args, loaded, feeds)
        return code
    finally:
        if code != OK:  # a failed run leaves no folder of its own behind
            remove_empty_folders(created)


def _run(args, loaded, feeds) -> int:
    import dataclasses

    import dyndq
    from dyndq.reference import NotRunnable
    from dyndq.runner import FeedError, OutputError, OutputNameError, runner

    try:
        r = runner(loaded.model, args.engine, args.outputs)
    except OutputNameError as e:  # --output names a value the model does not have
        if len(e.problems) == 1:
            raise UsageError(f"{args.model}: --output {e.problems[0]}") from None
        raise UsageError(problem_list(f"{args.model}: the outputs asked for", e.problems, item="--output ")) from None
    except NotRunnable as e:  # nodes the reference engine has no way to run: each named, with the way out
        head = f"{args.model}: the {args.engine} engine cannot run this model"
        raise ProblemsFound(f"{head}: {e.problems[0]}" if len(e.problems) == 1 else problem_list(head, e.problems)) from None
    except dyndq.ValidationError:  # problems in the model: told by the one mapping
        raise
    except Exception as e:  # the engine cannot be built for this model (an op it lacks, a model it refuses)
        raise ProblemsFound(f"{args.model}: the {args.engine} engine cannot run this model: "
                            f"{explained(e, loaded.model)}") from None
    try:
        outputs = r(feeds)
    except FeedError:  # the feeds do not fit the graph's inputs: told by the one mapping
        raise
    except OutputError as e:  # what the engine gave does not fit the declared outputs: no result is shown
        raise ProblemsFound(problem_list(
            f"{args.model}: the {args.engine} engine gave outputs that do not fit their declared types",
            e.problems, item="output ")) from None
    except dyndq.ValidationError as e:  # a node refused what it was given while running
        where = [f"node {p.node!r} ({p.op}): " if p.node else f"({p.op}): " if p.op else "" for p in e.problems]
        lines = [f"{w}{dataclasses.replace(p, op=None)}" for w, p in zip(where, e.problems)]
        raise ProblemsFound(f"{args.model}: the {args.engine} engine failed: " + "; ".join(lines)) from None
    except Exception as e:  # the engine failed on this model
        raise ProblemsFound(f"{args.model}: the {args.engine} engine failed: {explained(e, loaded.model)}") from None
    if args.output_dir:
        _save_arrays(args.output_dir, outputs, "--output-dir")
    else:
        from dyndq.arrays import describe

        for name, value in outputs.items():
            print("\n".join(describe(name, value)))
    return OK


def inputs_from_dirs(folders: list[str], model, given: set[str]) -> dict[str, np.ndarray]:
    """Each graph input not in `given`, from its file (NAME.npy, as import-onednn --inputs-dir and
    run --output-dir write them) in the first of `folders` that holds one.  Every input missing
    from all of them is named at once; files for no input are said and left alone."""
    from dyndq.atomic_writes import ModelFileError
    from dyndq.npy import NpyNameClash, npy_inputs, read_array

    initializers = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in initializers and vi.name not in given]
    try:
        found, unused = npy_inputs(folders, names)
    except NpyNameClash as e:
        raise UsageError(f"--output-dir {e}") from None
    except ModelFileError as e:
        raise UsageError(f"--inputs-dir {e}") from None
    for folder, extra in unused:
        print(f"note: --inputs-dir {folder}: {extra} is for no input of the model (left alone)", file=sys.stderr)
    feeds = {}
    for name, path in found.items():
        try:
            feeds[name] = read_array(path)
        except ModelFileError as e:
            raise UsageError(f"--inputs-dir: {e}") from None
    return feeds


def input_samples(args, model_path: str) -> list[dict] | None:
    """The feeds of --input and --inputs-dir: one sample per folder (--input's arrays in each),
    or --input's alone; None when neither is given (quantize's evaluation, verify's outputs)."""
    given = parse_inputs(args.input)
    if not args.inputs_dir:
        return [given] if given else None
    from dyndq.model_files import read_model

    model = read_model(model_path, load_data=False).model
    return [{**inputs_from_dirs([folder], model, set(given)), **given} for folder in args.inputs_dir]


def _save_arrays(folder: str, arrays: dict, flag: str, *, raw_bytes_note: bool = False) -> None:
    """Write each array (or each item of a list of arrays) as a .npy file in `folder`, named
    by `output_files`, saying what was written (and, with raw_bytes_note, how to read back
    the dtypes NumPy stores as raw bytes)."""
    from dyndq.npy import save_array

    files = output_files(folder, arrays)
    try:
        os.makedirs(folder, exist_ok=True)
        for label, path, value in files:
            save_array(path, value)  # a file it cannot write: a ModelFileError
            say_saved(path, value, label, raw_bytes_note=raw_bytes_note)
    except OSError as e:
        raise UsageError(f"{flag} {os_error(e)}") from None


RUN = Command("run", _add_parser, cmd_run, subject="model")
