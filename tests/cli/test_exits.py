"""The one mapping from errors to exit codes (dyndq/cli/exits.py): every error class the commands
raise has its code there, no entry is hidden by an earlier one, and every command's errors go
through it."""
from __future__ import annotations

import dataclasses

import dyndq
from cases import call
from dyndq.cli import COMMANDS, exits


def _error_classes() -> set[type]:
    """dyndq's error classes a command can let through: ModelFileError and every ValidationError
    subclass dyndq defines, with the CLI's own two."""
    import dyndq.onednn, dyndq.parity, dyndq.quantization, dyndq.reference, dyndq.run_outputs, dyndq.runner  # noqa: E401, F401
    from dyndq.atomic_writes import ModelFileError

    found, todo = set(), [dyndq.ValidationError, ModelFileError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("dyndq."):  # (not a test's own subclass)
            found.add(cls)
        todo += cls.__subclasses__()
    return found | {exits.UsageError, exits.ProblemsFound}


def test_no_entry_of_the_table_is_hidden_by_an_earlier_one():
    classes = [cls for cls, _, _ in exits.table()]
    for i, earlier in enumerate(classes):
        for later in classes[i + 1:]:
            assert not issubclass(later, earlier), f"{later.__name__} comes after {earlier.__name__}, its base"


def test_every_error_class_the_commands_raise_is_told_with_a_users_exit_code(capsys):
    """Each is a usage error (2) or problems found (1), never an internal error (70); a
    ValidationError of a command that reads no model is ours (70)."""
    problem = dyndq.Problem(argument="axis", found="0", allowed="1")
    for cls in sorted(_error_classes(), key=lambda c: c.__name__):
        if issubclass(cls, dyndq.ValidationError):
            e = cls([problem], ["MatMul"]) if cls.__name__ == "NothingToQuantize" else cls([problem])
        else:
            e = cls("m.onnx: no such file")
        code = exits.tell(e, "m.onnx")
        assert code in (exits.USAGE, exits.PROBLEMS), (cls, code)
    try:
        raise dyndq.ValidationError([problem])
    except dyndq.ValidationError as e:
        assert exits.tell(e, None) == exits.INTERNAL
    capsys.readouterr()


def test_every_command_tells_its_errors_through_the_mapping(capsys, monkeypatch):
    """Each command's errors reach exits.tell, about the file the command reads."""
    argv = {"demo": [], "check": ["F"], "export": ["F", "O"], "lift": ["F", "O"], "run": ["F"],
            "import-onednn": ["F", "O"], "export-onednn": ["F", "O"], "quantize": ["F", "O"], "schema": [],
            "import-weights": ["F", "C", "-o", "O"], "verify": ["F", "--against", "S"]}
    assert set(argv) == set(COMMANDS)
    cases = [
        (exits.UsageError("--x: bad"), 2, "dyndq: --x: bad\n"),
        (dyndq.ValidationError([dyndq.Problem(argument="axis", found="0", allowed="1")]), 1, "F: 1 problem\n"),
        (RuntimeError("a bug"), 70, "dyndq: internal error: RuntimeError: a bug"),
        (KeyboardInterrupt(), 130, "dyndq: interrupted\n"),
    ]
    for raised, code, told in cases:
        def fail(args, raised=raised):
            raise raised

        for name, command in COMMANDS.items():
            monkeypatch.setitem(COMMANDS, name, dataclasses.replace(command, run=fail))
            got, out, err = call(capsys, name, *argv[name])
            if isinstance(raised, dyndq.ValidationError) and command.subject is None:
                assert got == 70, name  # a command that reads no model: a ValidationError is a bug of ours
                continue
            assert (got, out) == (code, ""), (name, raised, got, out)
            assert err.startswith(told), (name, err)
            monkeypatch.setitem(COMMANDS, name, command)
