"""The `dyndq` command (also `python -m dyndq`): every job of the package from a shell.

    dyndq demo   [--out DIR]
    dyndq check  MODEL [--json] [--runtime-parity [--engine onnxruntime|openvino|all] [--level L ...] [--input NAME=FILE.npy ...]
                 [--inputs-dir DIR] [--no-diagnosis]]
    dyndq export IN OUT [--opset N] [--target onnx|onnxruntime|openvino] [--accuracy-level N] [--overwrite]
    dyndq lift   IN OUT [--overwrite]
    dyndq run    MODEL [--input NAME=FILE.npy ...] [--inputs-dir DIR] [--engine reference|onnxruntime] [--output NAME ...]
                 [--output-dir DIR]
    dyndq schema
    dyndq import-onednn GRAPH.json OUT.onnx [--inputs-dir DIR] [--seed N] [--max-input-bytes N]
    dyndq export-onednn MODEL.onnx OUT.json [--weights-as-inputs]
    dyndq quantize IN OUT [--bits 2|4|8] [--group-size N] [--method rtn|search|gptq|awq] [--emit FORM] [--json] [--overwrite] ...
    dyndq import-weights MODEL.onnx CHECKPOINT -o OUT.onnx [--names MAP.json] [--emit dyndq|onnx|onnxruntime|openvino] [--json]
    dyndq verify QUANTIZED.onnx --against SOURCE [--json] [--input NAME=FILE.npy ... | --inputs-dir DIR] [--weights-only] [--engine E ...] [--level L ...]

Exit codes: 0 success, 1 problems found in the model (or an engine cannot run it),
2 usage or I/O error, 70 internal error (a bug in dyndq), 130 interrupted.
Every model a command writes is checked before it is put in place (dyndq.written).
Mistakes a user can make (a missing or non-ONNX file, a bad --input) are told
in one or two plain lines on stderr, never with a traceback.

One module per group of commands, each holding its commands' parsers and code:
demo.py (demo), inspection.py (check, schema), conversion.py (export, lift), run.py (run),
onednn.py (import-onednn, export-onednn), quantize.py (quantize), import_weights.py (import-weights), verify.py (verify). Every error a command
raises goes through one mapping to its exit code and words (exits.py); what the commands
share is in common.py.
"""
from __future__ import annotations

import argparse
import sys

from dyndq.cli import conversion, demo, import_weights, inspection, onednn, quantize, run, verify
from dyndq.cli.common import UntilClosed
from dyndq.cli.exits import USAGE, tell

# every command, in the order `dyndq --help` lists them
COMMANDS = {c.name: c for c in (demo.DEMO, inspection.CHECK, conversion.EXPORT, conversion.LIFT, run.RUN,
                                onednn.IMPORT, onednn.EXPORT, quantize.QUANTIZE, import_weights.IMPORT_WEIGHTS,
                                verify.VERIFY, inspection.SCHEMA)}


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors told in two lines instead of the whole usage text."""

    def error(self, message: str):
        self.exit(USAGE, f"{self.prog}: {message}\n(see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every command, in the order `dyndq --help` lists them."""
    p = _Parser(
        prog="dyndq",
        description="oneDNN Graph's DynamicDequantize as an ONNX custom-domain op: check, export, lift and run models that use it.",
        epilog="Exit codes: 0 success, 1 problems found in the model (or an engine cannot run it), "
               "2 usage or I/O error, 70 internal error (a bug in dyndq; please report it), 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in COMMANDS.values():
        command.add_parser(sub)
    return p


def _version() -> str:
    import dyndq

    return dyndq.__version__


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2, already printed)
        return e.code if isinstance(e.code, int) else USAGE
    command = COMMANDS[args.command]
    stdout = sys.stdout
    sys.stdout = UntilClosed(stdout)  # `dyndq ... | head -1`: the work goes on, the printing stops
    try:
        return command.run(args)
    except (Exception, KeyboardInterrupt) as e:  # every error, through the one mapping to exit codes
        return tell(e, getattr(args, command.subject) if command.subject else None)
    finally:
        sys.stdout = stdout
