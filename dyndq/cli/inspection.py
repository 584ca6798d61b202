"""Looking at a model and at the op: `dyndq check` (every problem, or --runtime-parity: each engine
setting against the model's meaning) and `dyndq schema`."""
from __future__ import annotations

import json
import shutil
import sys

from dyndq.cli.common import Command, load, parse_inputs
from dyndq.cli.exits import OK, PROBLEMS, ProblemsFound, UsageError
from dyndq.wording import engine_error, first_line, problem_list


def _add_check(sub) -> None:
    from dyndq.converters.engines import compared
    from dyndq.ort_session import LEVELS

    c = sub.add_parser("check", help="list every problem with the use of DynamicDequantize in a model",
                       description="Print every problem found in MODEL (node, argument, found, allowed). "
                                   "Exit 0 when it is valid, 1 when problems were found.")
    c.add_argument("model", metavar="MODEL")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument("--runtime-parity", action="store_true",
                   help="instead: run MODEL on each engine setting and compare its outputs with the model's exact "
                        "meaning (the reference engine; max |a - b| <= 1e-4 * max |b|); for a setting that differs, "
                        "name the rewrite or setting responsible and the first node that differs; exit 1 when one "
                        "differs (docs/parity.md)")
    c.add_argument("--engine", choices=(*compared(), "all"), default="onnxruntime",
                   help="with --runtime-parity: the engine checked (default: onnxruntime; all: every one installed)")
    c.add_argument("--level", choices=LEVELS, action="append",
                   help="with --runtime-parity: an ONNX Runtime optimization level compared (repeat it for more; "
                        "default: every level)")
    c.add_argument("--input", "-i", metavar="NAME=FILE.npy", action="append", default=[],
                   help="with --runtime-parity: a graph input and the .npy file holding it (others get example "
                        "values: open dims 4, floats N(0, 1), Gather indices in range)")
    c.add_argument("--inputs-dir", metavar="DIR", action="append", default=[],
                   help="with --runtime-parity: a folder of NAME.npy files, one per graph input (as `dyndq run "
                        "--inputs-dir` reads them); --input comes first")
    c.add_argument("--no-diagnosis", action="store_true",
                   help="with --runtime-parity: compare only; no search for the rewrite or setting responsible, "
                        "nor for the first node")


def cmd_check(args) -> int:
    import dyndq

    if args.runtime_parity:
        return _runtime_parity(args)
    if args.input or args.inputs_dir or args.level or args.engine != "onnxruntime" or args.no_diagnosis:
        raise UsageError("--input, --inputs-dir, --level, --engine and --no-diagnosis go with --runtime-parity")
    loaded = load(args.model)
    problems = dyndq.check(loaded.model)
    if args.json:
        print(json.dumps({"model": args.model, "valid": not problems, "problems": [p.as_dict() for p in problems]}, indent=2))
    elif problems:
        print(problem_list(args.model, problems))
    else:
        print(f"{args.model}: valid (no problems found)")
    return PROBLEMS if problems else OK


def _runtime_parity(args) -> int:
    import dyndq
    from dyndq.cli.run import inputs_from_dirs
    from dyndq.engine_failures import explained
    from dyndq.converters.engines import ENGINES as TABLE
    from dyndq.parity import ENGINES, EngineMissing, ExamplesDoNotFit, runtime_parity
    from dyndq.runner import session_module

    loaded = load(args.model)
    feeds = parse_inputs(args.input)
    if args.inputs_dir:
        feeds = {**inputs_from_dirs(args.inputs_dir, loaded.model, set(feeds)), **feeds}
    engines = (args.engine,) if args.engine != "all" else tuple(e for e in ENGINES if session_module(e).installed())
    missing = [TABLE[e].title for e in ENGINES if e not in engines]
    if args.engine == "all" and missing:
        print(f"note: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
              f"{', '.join(TABLE[e].title for e in engines)} only", file=sys.stderr)
    progress = _progress if sys.stderr.isatty() else None
    try:
        report = runtime_parity(loaded.model, engines=engines, levels=args.level, feeds=feeds,
                                diagnose=not args.no_diagnosis, progress=progress, label=args.model)
    except dyndq.ValidationError:  # problems in the model, feeds that do not fit its inputs: told by the one mapping
        raise
    except EngineMissing as e:
        raise UsageError(f"--engine {args.engine}: {e}") from None
    except ExamplesDoNotFit as e:  # inputs made up for the check that do not fit the model: give them
        raise UsageError(f"{args.model}: {e}: {engine_error(e.__cause__)}") from None
    except ValueError as e:  # an input no example can be made for
        raise UsageError(f"{args.model}: {first_line(e)}") from None
    except Exception as e:  # the engine cannot load or run the model at all
        raise ProblemsFound(f"{args.model}: cannot run this model: {explained(e, loaded.model)}") from None
    finally:
        if progress is not None:
            _progress("")
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(f"{args.model}: {report.summary()}")
        for line in report.lines():
            print(f"  {line}")
    return OK if report.agrees else PROBLEMS


def _progress(text: str) -> None:
    """One line on the terminal, written over by the next (stderr only, and only when it is a terminal)."""
    width = shutil.get_terminal_size().columns - 1
    sys.stderr.write("\r" + text[:width].ljust(width) + ("\r" if not text else ""))
    sys.stderr.flush()


def _add_schema(sub) -> None:
    sub.add_parser("schema", help="print the op's schema",
                   description="Print each registered op version: inputs, outputs, attributes with defaults, type constraints.")


def cmd_schema(args) -> int:
    from dyndq.schema import schema_text

    print(schema_text())
    return OK


CHECK = Command("check", _add_check, cmd_check, subject="model")
SCHEMA = Command("schema", _add_schema, cmd_schema)
