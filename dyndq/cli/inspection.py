"""Looking at a model and at the op: `dyndq check` (every problem, or --runtime-parity against ONNX
Runtime's optimizations) and `dyndq schema`."""
from __future__ import annotations

import json

from dyndq.cli.common import Command, engine_message, load, parse_inputs
from dyndq.cli.exits import OK, PROBLEMS, ProblemsFound, UsageError
from dyndq.wording import first_line, problem_list


def _add_check(sub) -> None:
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


def cmd_check(args) -> int:
    import dyndq

    if args.runtime_parity:
        return _runtime_parity(args)
    if args.input or args.level != "all":
        raise UsageError("--input and --level go with --runtime-parity")
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
    from dyndq.parity import ExamplesDoNotFit, runtime_parity

    if args.json:
        raise UsageError("--json does not go with --runtime-parity")
    loaded = load(args.model)
    feeds = parse_inputs(args.input)
    try:
        report = runtime_parity(loaded.model, level=args.level, feeds=feeds)
    except dyndq.ValidationError:  # problems in the model, feeds that do not fit its inputs: told by the one mapping
        raise
    except ExamplesDoNotFit as e:  # inputs made up for the check that do not fit the model: give them
        raise UsageError(f"{args.model}: {e}: {engine_message(e.__cause__)}") from None
    except ValueError as e:  # an input no example can be made for
        raise UsageError(f"{args.model}: {first_line(e)}") from None
    except Exception as e:  # ONNX Runtime cannot load or run the model
        raise ProblemsFound(f"{args.model}: ONNX Runtime cannot run this model: {engine_message(e)}") from None
    print(f"{args.model}: {report.summary()}")
    for line in report.lines():
        print(f"  {line}")
    return PROBLEMS if report.differing else OK


def _add_schema(sub) -> None:
    sub.add_parser("schema", help="print the op's schema",
                   description="Print each registered op version: inputs, outputs, attributes with defaults, type constraints.")


def cmd_schema(args) -> int:
    from dyndq.schema import schema_text

    print(schema_text())
    return OK


CHECK = Command("check", _add_check, cmd_check, subject="model")
SCHEMA = Command("schema", _add_schema, cmd_schema)
