"""`dyndq demo`: build, check, run and export a small weight-only-quantized MLP (what `make demo` runs)."""
from __future__ import annotations

import os

from dyndq.cli.common import Command
from dyndq.cli.exits import OK, PROBLEMS, UsageError
from dyndq.wording import os_error


def _add_parser(sub) -> None:
    d = sub.add_parser("demo", help="build, check, run and export a small weight-only-quantized MLP",
                       description="Build a small weight-only-quantized MLP holding DynamicDequantize, check it, "
                                   "infer its shapes, run it on both engines, export it, and write both models.")
    d.add_argument("--out", metavar="DIR", default="dyndq-demo", help="where to write the models (default: ./dyndq-demo)")


def cmd_demo(args) -> int:
    from dyndq.demo import run_demo
    from dyndq.atomic_writes import check_writable

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"{args.out}: exists and is not a folder")
    check_writable(args.out)  # before the work, not after it
    try:
        result = run_demo(args.out)
    except OSError as e:
        raise UsageError(os_error(e)) from None
    return OK if result.agree else PROBLEMS


DEMO = Command("demo", _add_parser, cmd_demo)
