"""The `dyndq` command (also `python -m dyndq`): every job of the package from a shell.

    dyndq demo   [--out DIR]
    dyndq check  MODEL [--json] [--runtime-parity [--level basic|extended|all] [--input NAME=FILE.npy ...]]
    dyndq export IN OUT [--opset N] [--target onnx|onnxruntime] [--accuracy-level N]
    dyndq lift   IN OUT
    dyndq run    MODEL [--input NAME=FILE.npy ...] [--inputs-dir DIR] [--engine reference|onnxruntime] [--output NAME ...]
                 [--output-dir DIR]
    dyndq schema
    dyndq import-onednn GRAPH.json OUT.onnx [--inputs-dir DIR] [--seed N] [--max-input-bytes N]
    dyndq export-onednn MODEL.onnx OUT.json [--weights-as-inputs]
    dyndq quantize IN OUT [--bits 4|8] [--group-size N] [--method rtn|search] [--emit FORM] [--json] ...

Exit codes: 0 success, 1 problems found in the model (or an engine cannot run it),
2 usage or I/O error, 70 internal error (a bug in dyndq), 130 interrupted.
Mistakes a user can make (a missing or non-ONNX file, a bad --input) are told
in one or two plain lines on stderr, never with a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap

import numpy as np

from dyndq.wording import first_line, os_error, plural, problem_list, table as _table

OK, PROBLEMS, USAGE = 0, 1, 2
INTERNAL = 70  # sysexits.h EX_SOFTWARE: a bug in dyndq, not in the model or the command line


class UsageError(Exception):
    """A mistake in how the command was called, or a file it cannot use (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors told in two lines instead of the whole usage text."""

    def error(self, message: str):
        self.exit(USAGE, f"{self.prog}: {message}\n(see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    from dyndq.runner import ENGINES

    p = _Parser(
        prog="dyndq",
        description="oneDNN Graph's DynamicDequantize as an ONNX custom-domain op: check, export, lift and run models that use it.",
        epilog="Exit codes: 0 success, 1 problems found in the model (or an engine cannot run it), "
               "2 usage or I/O error, 70 internal error (a bug in dyndq; please report it), 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    d = sub.add_parser("demo", help="build, check, run and export a small weight-only-quantized MLP",
                       description="Build a small weight-only-quantized MLP holding DynamicDequantize, check it, "
                                   "infer its shapes, run it on both engines, export it, and write both models.")
    d.add_argument("--out", metavar="DIR", default="dyndq-demo", help="where to write the models (default: ./dyndq-demo)")

    c = sub.add_parser("check", help="list every problem with the use of DynamicDequantize in a model",
                       description="Print every problem found in MODEL (node, argument, found, allowed). "
                                   "Exit 0 when it is valid, 1 when problems were found.")
    c.add_argument("model", metavar="MODEL")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument("--runtime-parity", action="store_true",
                   help="instead: run MODEL on ONNX Runtime with graph optimizations off and at --level, and name "
                        "every output that differs beyond MatMul reordering (max |a - b| > 1e-4 * max |b|), "
                        "with the node types ONNX Runtime rewrote; exit 1 when one does")
    c.add_argument("--level", choices=("basic", "extended", "all"), default="all",
                   help="the optimization level compared with none (default: all, ONNX Runtime's default)")
    c.add_argument("--input", "-i", metavar="NAME=FILE.npy", action="append", default=[],
                   help="with --runtime-parity: a graph input and the .npy file holding it (others get example "
                        "values: open dims 4, floats N(0, 1), Gather indices in range)")

    e = sub.add_parser("export", help="lower every DynamicDequantize to standard ONNX",
                       description="Write OUT: IN with every DynamicDequantize lowered to standard ONNX operators.")
    e.add_argument("input", metavar="IN")
    e.add_argument("output", metavar="OUT")
    e.add_argument("--opset", metavar="N", type=int, help="the ai.onnx opset to write (default: the model's, raised if needed)")
    e.add_argument("--target", choices=("onnx", "onnxruntime"), default="onnx",
                   help="onnx: standard ONNX only (ONNX Runtime's MatMulNBits/GatherBlockQuantized become "
                        "DequantizeLinear + MatMul/Gather); onnxruntime: those contrib ops where they express "
                        "a DynamicDequantize on constant weights exactly (default: onnx)")
    e.add_argument("--accuracy-level", metavar="N", type=int, choices=range(5),
                   help="with --target onnxruntime: the accuracy_level of every MatMulNBits written (default: what "
                        "a lifted node kept, else 0, the graph's float meaning; 4 quantizes the activations to int8)")

    l = sub.add_parser("lift", help="turn DequantizeLinear, MatMulNBits and GatherBlockQuantized nodes into DynamicDequantize",
                       description="Write OUT: IN with every DequantizeLinear, com.microsoft::MatMulNBits and "
                                   "com.microsoft::GatherBlockQuantized that DynamicDequantize expresses exactly lifted to it.")
    l.add_argument("input", metavar="IN")
    l.add_argument("output", metavar="OUT")

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

    _onednn_parsers(sub)
    _quantize_parser(sub)

    sub.add_parser("schema", help="print the op's schema",
                   description="Print each registered op version: inputs, outputs, attributes with defaults, type constraints.")
    return p


def _version() -> str:
    import dyndq

    return dyndq.__version__


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2, already printed)
        return e.code if isinstance(e.code, int) else USAGE
    stdout = sys.stdout
    sys.stdout = _UntilClosed(stdout)  # `dyndq ... | head -1`: the work goes on, the printing stops
    try:
        return _COMMANDS[args.command](args)
    except UsageError as e:
        _err(str(e))
        return USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as e:  # a bug of ours: its own exit code, never 1 ("problems found")
        import traceback

        if os.environ.get("DYNDQ_TRACEBACK"):
            traceback.print_exc()
        where = traceback.extract_tb(e.__traceback__)[-1]
        _err(f"internal error: {type(e).__name__}: {first_line(e)} (at {os.path.basename(where.filename)}:{where.lineno}; "
             f"set DYNDQ_TRACEBACK=1 for the traceback, and please report it)")
        return INTERNAL
    finally:
        sys.stdout = stdout


class _UntilClosed:
    """A text stream that writes to `inner` until its reader goes away (EPIPE), then drops
    what is printed, so a closed pipe stops the printing but never the work (the outputs and
    files a command writes). The file descriptor is pointed at os.devnull then, so the
    interpreter's last flush at exit does not fail either."""

    def __init__(self, inner):
        self._inner = inner
        self._closed = False

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._inner.write(text)
            except BrokenPipeError:
                self._close()
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._close()

    def _close(self) -> None:
        self._closed = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._inner.fileno())
            os.close(devnull)
        except (OSError, AttributeError, ValueError):  # not a real file (a test's capture)
            pass

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _err(message: str) -> None:
    print(f"dyndq: {message}", file=sys.stderr)


def _load(path: str):
    from dyndq.files import ModelFileError, read_model

    try:
        return read_model(path)
    except ModelFileError as e:
        raise UsageError(str(e)) from None


def _save(model, path: str, loaded) -> list[str]:
    """Save `model` as the input was saved (with external data or not); returns notes to print."""
    from dyndq.files import ModelFileError, save_model

    try:
        location = save_model(model, path, external_data=loaded.external_data)
    except ModelFileError as e:
        raise UsageError(str(e)) from None
    same = os.path.realpath(path) == os.path.realpath(loaded.path)
    return _data_notes(location, [loc for loc in loaded.locations if loc != location] if same else [])


def _data_notes(location: str | None, kept: list[str]) -> list[str]:
    """What became of the external data: the file written (if any), and the data files of the
    model a write replaced, which are kept (a copy of the model made before may point into them:
    never ours to delete)."""
    notes = []
    if location is not None:
        notes.append(f"  its tensors are in {location}, beside it")
    if kept:
        notes.append(f"  kept {', '.join(kept)}, the data of the model it replaced: other copies of that "
                     "model may point into it; delete it when none does")
    return notes


def _print_problems(path: str, problems, stream) -> None:
    print(problem_list(path, problems), file=stream)


# -- commands ---------------------------------------------------------------------------------


def cmd_demo(args) -> int:
    from dyndq.demo import run_demo
    from dyndq.files import ModelFileError

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"{args.out}: exists and is not a folder")
    _check_writable(args.out)  # before the work, not after it
    try:
        result = run_demo(args.out)
    except ModelFileError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(os_error(e)) from None
    return OK if result.agree else PROBLEMS


def _check_writable(folder: str) -> list[str]:
    """Create `folder` if needed and make sure a file can be written in it (UsageError if not);
    returns the folders it created, outermost first (see files.make_folders)."""
    import tempfile

    from dyndq.files import make_folders, remove_empty_folders

    created = []
    try:
        created = make_folders(folder)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        remove_empty_folders(created)
        raise UsageError(f"{folder}: cannot write there ({e.strerror or e})") from None
    return created


def cmd_check(args) -> int:
    import dyndq

    if args.runtime_parity:
        return _runtime_parity(args)
    if args.input or args.level != "all":
        raise UsageError("--input and --level go with --runtime-parity")
    loaded = _load(args.model)
    problems = dyndq.check(loaded.model)
    if args.json:
        print(json.dumps({"model": args.model, "valid": not problems, "problems": [p.as_dict() for p in problems]}, indent=2))
    elif problems:
        _print_problems(args.model, problems, sys.stdout)
    else:
        print(f"{args.model}: valid (no problems found)")
    return PROBLEMS if problems else OK


def _runtime_parity(args) -> int:
    import dyndq
    from dyndq.parity import ExamplesDoNotFit, runtime_parity
    from dyndq.runner import FeedError

    if args.json:
        raise UsageError("--json does not go with --runtime-parity")
    loaded = _load(args.model)
    feeds = _parse_inputs(args.input)
    try:
        report = runtime_parity(loaded.model, level=args.level, feeds=feeds)
    except FeedError as e:  # the feeds given do not fit the graph's inputs
        raise _feed_error(args.model, e) from None
    except ExamplesDoNotFit as e:  # inputs made up for the check that do not fit the model: give them
        raise UsageError(f"{args.model}: {e}: {_engine_message(e.__cause__)}") from None
    except dyndq.ValidationError as e:
        _print_problems(args.model, e.problems, sys.stderr)
        return PROBLEMS
    except ValueError as e:  # an input no example can be made for
        raise UsageError(f"{args.model}: {first_line(e)}") from None
    except Exception as e:  # ONNX Runtime cannot load or run the model
        _err(f"{args.model}: ONNX Runtime cannot run this model: {_engine_message(e)}")
        return PROBLEMS
    print(f"{args.model}: {report.summary()}")
    for line in report.lines():
        print(f"  {line}")
    return PROBLEMS if report.differing else OK


def _opset_and_ir(model) -> str:
    from dyndq.graphs import ai_onnx_version

    opset = ai_onnx_version(model.opset_import)
    return f"ai.onnx opset {opset}, IR version {model.ir_version}"


def cmd_export(args) -> int:
    import dyndq
    from dyndq.exporter import export_with_report

    loaded = _load(args.input)
    if args.accuracy_level is not None and args.target != "onnxruntime":
        raise UsageError("--accuracy-level goes with --target onnxruntime (standard ONNX has no MatMulNBits)")
    try:
        out, report = export_with_report(loaded.model, opset=args.opset, target=args.target,
                                         accuracy_level=args.accuracy_level)
        loaded.model = None  # (the input's memory is free before the output is written: peak 2x, not 3x)
    except dyndq.ValidationError as e:
        _print_problems(args.input, e.problems, sys.stderr)
        return PROBLEMS
    except ValueError as e:  # ExportError: e.g. --opset too low for the graph
        raise UsageError(f"{args.input}: {first_line(e)}") from None
    notes = _save(out, args.output, loaded)
    print(f"wrote {args.output}: {report.summary()}")
    for note in notes:
        print(note)
    for line in report.lines():
        print(f"  {line}")
    return OK


def cmd_lift(args) -> int:
    from dyndq.lifter import lift_with_report

    loaded = _load(args.input)
    out, report = lift_with_report(loaded.model)
    loaded.model = None  # (the input's memory is free before the output is written)
    notes = _save(out, args.output, loaded)
    print(f"wrote {args.output}: {report.summary()}; {_opset_and_ir(out)}")
    for note in notes:
        print(note)
    for s in report.skipped:
        print(f"  {s}")
    for note in report.notes:
        print(f"  note: {note}")
    return OK


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def _parse_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    from dyndq.files import ModelFileError, read_array

    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {spec!r}: expected NAME=FILE.npy")
        if name in feeds:
            raise UsageError(f"--input {spec!r}: input {name!r} given twice")
        try:
            feeds[name] = read_array(path)
        except ModelFileError as e:
            raise UsageError(f"--input {spec!r}: {e}") from None
    return feeds


def _inputs_from_dirs(folders: list[str], model, given: set[str]) -> dict[str, np.ndarray]:
    """Each graph input not in `given`, from the file `_output_files` names for it (NAME.npy, as
    import-onednn --inputs-dir and run --output-dir write them) in the first of `folders` that
    holds one.  Every input missing from all of them is named at once; files for no input are
    said and left alone."""
    from dyndq.files import ModelFileError, read_array

    for folder in folders:
        if not os.path.isdir(folder):
            raise UsageError(f"--inputs-dir {folder}: no such folder")
    initializers = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in initializers and vi.name not in given]
    found, known = {}, set()
    for folder in folders:
        files = {label: path for label, path, _ in _output_files(folder, {n: np.empty(0) for n in names})}
        known |= {os.path.abspath(p) for p in files.values()}
        found.update({n: files[n] for n in names if n not in found and os.path.isfile(files[n])})
    missing = [n for n in names if n not in found]
    if missing:
        raise UsageError(f"--inputs-dir {', '.join(folders)}: no file for {plural(len(missing), 'input')}: " +
                         ", ".join(f"{n} ({_output_files('', {n: np.empty(0)})[0][1]})" for n in missing))
    for folder in folders:
        for extra in sorted(f for f in os.listdir(folder) if f.endswith(".npy")):
            if os.path.abspath(os.path.join(folder, extra)) not in known:
                print(f"note: --inputs-dir {folder}: {extra} is for no input of the model (left alone)", file=sys.stderr)
    feeds = {}
    for name in names:
        try:
            feeds[name] = read_array(found[name])
        except ModelFileError as e:
            raise UsageError(f"--inputs-dir: {e}") from None
    return feeds


def _summary(name: str, a: np.ndarray) -> str:
    head = f"{name}: {a.dtype.name}{list(a.shape)}"
    if a.size == 0:
        return f"{head}  (empty)"
    # (ml_dtypes' bfloat16, float8, int4 and uint4 are of NumPy kind "V": judged by name)
    floating = a.dtype.kind == "f" or a.dtype.name == "bfloat16" or a.dtype.name.startswith("float8")
    if a.dtype.kind in "fiub" or floating or a.dtype.name in ("int4", "uint4"):
        numeric = a.astype(np.float64) if a.dtype.kind != "b" else a.astype(np.int8)
        finite = numeric[np.isfinite(numeric)] if floating else numeric.ravel()
        stats = "no finite values" if finite.size == 0 else (
            f"min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}"
        )
        if finite.size < a.size:  # said, not skipped: an overflow in the run is what one wants to know
            inf, nan = int(np.isinf(numeric).sum()), int(np.isnan(numeric).sum())
            stats += "  (" + ", ".join(w for w in (f"{inf} infinite" if inf else "", f"{nan} NaN" if nan else "") if w) + ")"
        first = np.array2string(a.ravel()[:6], precision=6, separator=", ")
        more = ", ...]" if a.size > 6 else ""
        return f"{head}  {stats}  first {first[:-1] + more if more else first}"
    return head


def _feed_error(model: str, e) -> UsageError:
    """Feeds that do not fit the graph's inputs (a FeedError): a usage error naming each input."""
    if len(e.problems) == 1:
        return UsageError(f"{model}: input {e.problems[0]}")
    return UsageError(problem_list(f"{model}: the inputs", e.problems, item="input "))


def cmd_run(args) -> int:
    from dyndq.files import remove_empty_folders

    loaded = _load(args.model)
    feeds = _parse_inputs(args.input)
    if args.inputs_dir:
        feeds = {**_inputs_from_dirs(args.inputs_dir, loaded.model, set(feeds)), **feeds}
    if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise UsageError(f"--output-dir {args.output_dir}: exists and is not a folder")
    created = _check_writable(args.output_dir) if args.output_dir else []  # before the run, not after it
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
        _err(f"{head}: {e.problems[0]}" if len(e.problems) == 1 else problem_list(head, e.problems))
        return PROBLEMS
    except dyndq.ValidationError as e:
        _print_problems(args.model, e.problems, sys.stderr)
        return PROBLEMS
    except Exception as e:  # the engine cannot be built for this model (an op it lacks, a model it refuses)
        _err(f"{args.model}: the {args.engine} engine cannot run this model: {_engine_message(e)}")
        return PROBLEMS
    try:
        outputs = r(feeds)
    except FeedError as e:  # the feeds do not fit the graph's inputs
        raise _feed_error(args.model, e) from None
    except OutputError as e:  # what the engine gave does not fit the declared outputs: no result is shown
        _err(problem_list(f"{args.model}: the {args.engine} engine gave outputs that do not fit their declared types",
                          e.problems, item="output "))
        return PROBLEMS
    except dyndq.ValidationError as e:  # a node refused what it was given while running
        where = [f"node {p.node!r} ({p.op}): " if p.node else f"({p.op}): " if p.op else "" for p in e.problems]
        lines = [f"{w}{dataclasses.replace(p, op=None)}" for w, p in zip(where, e.problems)]
        _err(f"{args.model}: the {args.engine} engine failed: " + "; ".join(lines))
        return PROBLEMS
    except Exception as e:  # the engine failed on this model
        _err(f"{args.model}: the {args.engine} engine failed: {_engine_message(e)}")
        return PROBLEMS
    if args.output_dir:
        _save_arrays(args.output_dir, outputs, "--output-dir")
    else:
        for name, value in outputs.items():
            if isinstance(value, list):
                print(f"{name}: a sequence of {plural(len(value), 'tensor')}")
                for i, item in enumerate(value):
                    print("  " + _summary(f"{name}[{i}]", item))
            elif value is None:
                print(f"{name}: (no value)")
            else:
                print(_summary(name, value))
    return OK


def _onednn_parsers(sub) -> None:
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
    x = sub.add_parser("export-onednn", help="an ONNX model as a oneDNN Graph JSON",
                       description="Write OUT.json: MODEL as a oneDNN graph (3.x format). Exit 1 with every "
                                   "problem when oneDNN cannot express it.")
    x.add_argument("model", metavar="MODEL.onnx")
    x.add_argument("output", metavar="OUT.json")
    x.add_argument("--weights-as-inputs", action="store_true",
                   help="make each initializer an op takes an input port (property_type constant) and write "
                        "its array as NAME.npy into OUT-weights/ beside OUT.json")


def cmd_import_onednn(args) -> int:
    import dyndq
    from dyndq import onednn
    from dyndq.files import ModelFileError, save_model, write_together

    if not os.path.isfile(args.graph):
        raise UsageError(f"{args.graph}: no such file")
    try:
        model, report = onednn.load(args.graph)
        arrays = None
        if args.inputs_dir:  # made before anything is written: OUT and DIR only when every step succeeded
            budget = {} if args.max_input_bytes is None else {"max_bytes": args.max_input_bytes}
            arrays = onednn.example_inputs(model, args.seed, **budget)
    except dyndq.ValidationError as e:
        _print_problems(args.graph, e.problems, sys.stderr)
        return PROBLEMS
    files = _output_files(args.inputs_dir, arrays) if arrays is not None else []
    try:
        if arrays is None:
            save_model(model, args.output)
        else:  # the model and its example inputs all or nothing
            write_together(args.output, lambda f: f.write(model.SerializeToString()), args.inputs_dir,
                           {os.path.basename(path): (lambda f, v=value: np.save(f, v, allow_pickle=False))
                            for _, path, value in files})
    except (ModelFileError, OSError) as e:
        raise UsageError(str(e)) from None
    print(f"wrote {args.output}: {report.summary()}")
    for note in report.notes:
        print(f"  note: {note}")
    for label, path, value in files:
        _say_saved(path, value, label, raw_bytes_note=True)
    return OK


def cmd_export_onednn(args) -> int:
    import dyndq
    from dyndq import onednn
    from dyndq.files import ModelFileError

    loaded = _load(args.model)
    weights: dict = {}
    try:
        doc = onednn.dump(loaded.model, weights_as_inputs=args.weights_as_inputs, weights=weights)
    except dyndq.ValidationError as e:
        _print_problems(args.model, e.problems, sys.stderr)
        return PROBLEMS
    try:  # the JSON and its weights (OUT-weights/NAME.npy) all or nothing
        written = onednn.save_json(doc, args.output, weights)
    except ModelFileError as e:
        raise UsageError(str(e)) from None
    print(f"wrote {args.output}: {len(doc['graph'])} oneDNN ops, "
          f"{len(doc['input_ports'])} input ports, {len(doc['output_ports'])} output ports")
    for path, value in written.items():
        _say_saved(path, value, raw_bytes_note=True)
    return OK


def _quantize_parser(sub) -> None:
    from dyndq.quantization import EMITS, METHODS, OPS, SCALE_DTYPES

    q = sub.add_parser("quantize", help="weight-only quantization of a float model (int4/int8, per group)",
                       description="Write OUT: IN with the constant weights of MatMul, Gemm and Gather as int4/int8 "
                                   "codes with per-group scales feeding DynamicDequantize (docs/quantize.md). Prints a "
                                   "table: per weight its form and error, the sizes, the output error on seeded random "
                                   "inputs, and the weights left alone. Exit 1 when nothing could be quantized.")
    q.add_argument("input", metavar="IN")
    q.add_argument("output", metavar="OUT")
    q.add_argument("--bits", type=int, choices=(4, 8), default=4, help="4 (default) or 8")
    q.add_argument("--group-size", type=int, default=128, metavar="N",
                   help="elements per group along the reduction axis (default 128); -1: one per whole axis (per channel)")
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
    import dyndq
    from dyndq.files import ModelFileError
    from dyndq.quantization import NothingToQuantize, OptionError, quantize_file

    def progress(line: str) -> None:  # on a terminal only: quiet when piped or captured
        print(line, file=sys.stderr, flush=True)

    try:
        report = quantize_file(
            args.input, args.output, emit=args.emit, evaluate=False if args.no_evaluate else None, seed=args.seed,
            strict=args.strict, progress=progress if sys.stderr.isatty() else None,
            save_weights=lambda written: [_say_saved(p, v, raw_bytes_note=not args.json) for p, v in written.items()],
            bits=args.bits, group_size=args.group_size, symmetric=args.symmetric, scale_dtype=args.scale_dtype,
            ops=[op for op in args.ops.split(",") if op], exclude=args.exclude, method=args.method)
    except ModelFileError as e:
        raise UsageError(str(e)) from None
    except OptionError as e:  # a bad option value: a usage error, each named by its flag
        for p in e.problems:
            _err(f"--{p.argument.replace('_', '-')}: found {p.found}; allowed: {p.allowed}")
        return USAGE
    except NothingToQuantize as e:
        print(f"{args.input}: nothing to quantize (nothing written): {e.reason}", file=sys.stderr)
        for p in e.problems:
            print(f"  - {p}", file=sys.stderr)
        return PROBLEMS
    except dyndq.ValidationError as e:  # --strict, and a weight left alone
        _print_problems(args.input, e.problems, sys.stderr)
        return PROBLEMS
    if args.no_evaluate:
        report.outputs_note = "not measured (--no-evaluate)"
    if args.json:
        print(json.dumps({"input": args.input, "output": args.output, "emit": args.emit, **report.as_dict()}, indent=2))
    else:
        print(f"wrote {args.output}: {report.summary()}")
        for note in _data_notes(report.data_file, report.kept_files):
            print(note)
        print("\n".join(report.table()))
    return OK


def _stem(path: str) -> str:
    return os.path.basename(path)[: -len(".npy")]


def _clean(name: str) -> str:
    safe = _SAFE_NAME.sub("_", name)
    return "_" + safe[1:] if safe.startswith(".") else safe  # no hidden files, no "." or ".."


def _save_arrays(folder: str, arrays: dict, flag: str, *, raw_bytes_note: bool = False) -> None:
    """Write each array (or each item of a list of arrays) as a .npy file in `folder`, named
    by `_output_files`, saying what was written (and, with raw_bytes_note, how to read back
    the dtypes NumPy stores as raw bytes)."""
    from dyndq.files import ModelFileError, save_array

    files = _output_files(folder, arrays)
    try:
        os.makedirs(folder, exist_ok=True)
        for label, path, value in files:
            save_array(path, value)
            _say_saved(path, value, label, raw_bytes_note=raw_bytes_note)
    except ModelFileError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{flag} {os_error(e)}") from None


def _say_saved(path: str, value: np.ndarray, label: str | None = None, *, raw_bytes_note: bool = False) -> None:
    """"wrote PATH: DTYPE[SHAPE]" (with the output's name when the file's differs), and, with
    raw_bytes_note, how to read back the dtypes NumPy stores as raw bytes."""
    print(f"wrote {path}: {value.dtype.name}{list(value.shape)}  ({label})" if label and label != _stem(path)
          else f"wrote {path}: {value.dtype.name}{list(value.shape)}")
    if raw_bytes_note and value.dtype.kind == "V":  # ml_dtypes' int4, uint4, bfloat16: bytes only
        print(f"  note: NumPy stores {value.dtype.name} as raw bytes: dyndq run reads it back as "
              f"the input's dtype; in Python, numpy.load(path).view(ml_dtypes.{value.dtype.name})")


def _output_files(folder: str, outputs: dict) -> list[tuple[str, str, np.ndarray]]:
    """(what, path, array) for each array to save: NAME.npy for a tensor output, NAME.I.npy for
    item I of a sequence output, NAME cleaned of characters unsafe in a file name. A cleaned
    name that meets another output's file name gets a short hash of the whole name added
    ('a/b' and 'a_b', two non-ASCII names of one length), so each output keeps a file of its
    own. Two that still meet (names equal but for case, which some file systems do not tell
    apart) are refused before anything is written."""
    items = []
    for name, value in outputs.items():
        if isinstance(value, list):
            items += [(f"{name}[{i}]", f"{name}.{i}", v) for i, v in enumerate(value)]
        elif value is not None:
            items.append((name, name, value))
    stems = [_clean(raw) for _, raw, _ in items]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem.casefold()] = counts.get(stem.casefold(), 0) + 1
    files, taken = [], {}
    for (label, raw, array), stem in zip(items, stems):
        if stem != raw and counts[stem.casefold()] > 1:
            import hashlib

            stem = f"{stem}-{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
        key = stem.casefold()
        if key in taken:
            raise UsageError(f"--output-dir {folder}: outputs {taken[key]!r} and {label!r} would both be "
                             f"saved as {stem}.npy; rename one of them in the model")
        taken[key] = label
        files.append((label, os.path.join(folder, stem + ".npy"), array))
    return files


def cmd_schema(args) -> int:
    print(schema_text())
    return OK


def schema_text() -> str:
    """Every registered op version as readable tables."""
    from dyndq.converters.onnx_types import attribute_type_name
    from dyndq.opdefs import all_versions

    blocks = []
    for op in all_versions():
        lines = [f"{op.qualname}, version {op.since_version}"]
        lines += textwrap.wrap(op.doc, width=88, initial_indent="  ", subsequent_indent="  ")
        lines += ["", "inputs"]
        lines += _table(
            ["name", "type", "use", "description"],
            [[p.name, p.type_var, "optional" if p.optional else "required", p.doc] for p in op.inputs],
        )
        lines += ["", "outputs"]
        lines += _table(["name", "type", "description"], [[p.name, p.type_var, p.doc] for p in op.outputs])
        lines += ["", "attributes"]
        lines += _table(
            ["name", "type", "default", "allowed", "description"],
            [
                [
                    a.name,
                    attribute_type_name(a.kind),
                    "(required)" if a.required else ("(none)" if a.default is None else json.dumps(a.default)),
                    " | ".join(json.dumps(v) for v in a.allowed) if a.allowed else "",
                    a.doc,
                ]
                for a in op.attributes
            ],
        )
        lines += ["", "type constraints"]
        lines += _table(["name", "types", "description"], [[c.name, ", ".join(c.dtypes), c.doc] for c in op.type_constraints])
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _engine_message(e: BaseException) -> str:
    """An engine's error in one line, without ONNX Runtime's "[ONNXRuntimeError] : 1 : FAIL :" prefix."""
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", first_line(e))


_COMMANDS = {
    "demo": cmd_demo,
    "check": cmd_check,
    "export": cmd_export,
    "lift": cmd_lift,
    "run": cmd_run,
    "schema": cmd_schema,
    "import-onednn": cmd_import_onednn,
    "export-onednn": cmd_export_onednn,
    "quantize": cmd_quantize,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
