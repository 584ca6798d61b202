"""The README and every page of docs/ run as a reader would follow them.

A page's fenced blocks run in the order they stand, in one fresh folder (where `tests/data` is
this repository's): each ```python block in one namespace for the whole page (as one pasted
session), its `print(...)` claims (the `# ` comment lines right after a print) checked; each
`$ dyndq ...` line of a plain fence through the CLI's real entry point, every line shown under it
required in what it printed (a line with "..." up to the "..."; lines of timings not compared)
and a `# exit code N` comment its exit code.  Fences of another language (```text, ```json,
```bash) are shown, not run.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from dyndq.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def printed_claims(block: str) -> list[str]:
    """What a block says a print shows: the comment lines right after a print(...) call, or
    a comment after the call on its own line."""
    claims, lines = [], block.splitlines()
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("print("):
            continue
        comment = []
        for follow in lines[i + 1:]:
            if not follow.startswith("# "):
                break
            comment.append(follow[2:])
        trailing = line.split("#", 1)[1] if "#" in line and ")" in line.split("#", 1)[0] else None
        if trailing:
            comment.insert(0, trailing)
        if comment:
            claims.append(" ".join(" ".join(comment).split()))
    return claims


def commands(block: str) -> list[tuple[list[str], int, list[str]]]:
    """(argv, exit code, lines shown) for each `$ dyndq ...` line of a plain fence."""
    runs = []
    for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
        if not chunk.startswith("$ dyndq"):
            continue
        head, *shown = chunk.rstrip("\n").split("\n")
        command, _, comment = head[2:].partition("#")
        code = re.search(r"exit code (\d+)", comment)
        runs.append((shlex.split(command)[1:], int(code.group(1)) if code else 0, shown))
    return runs


def _norm(line: str) -> str:
    return " ".join(line.split())


def _comparable(line: str) -> bool:
    return bool(line.strip()) and " ms" not in line and not re.search(r"\d s\b", line)


def run_page(page: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType(f"docs_{page.stem}")  # onnxscript looks a function's module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for i, (language, body) in enumerate(fences(page.read_text())):
        if language == "python":
            path = tmp_path / f"{page.stem}_block_{i}.py"  # a real file: @script reads its source
            path.write_text(body)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(body, str(path), "exec"), namespace)
            shown = _norm(out.getvalue())
            for claim in printed_claims(body):
                assert claim in shown, f"{page.name} block {i} says a print shows {claim!r}; it showed {shown!r}"
        elif language == "":
            capsys.readouterr()
            for argv, code, lines in commands(body):
                got = main(argv)
                out, err = capsys.readouterr()
                printed = [_norm(line) for line in (out + err).splitlines()]
                assert got == code, f"{page.name}: `dyndq {shlex.join(argv)}` exited {got}, not {code}: {err}"
                for line in filter(_comparable, lines):
                    if "..." in line:
                        head = _norm(line.split("...", 1)[0])
                        ok = any(p.startswith(head) for p in printed)
                    else:
                        ok = _norm(line) in printed
                    assert ok, f"{page.name}: `dyndq {shlex.join(argv)}` did not print {line!r}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_runs_as_written(page, tmp_path, monkeypatch, capsys):
    run_page(page, tmp_path, monkeypatch, capsys)


def test_readme_starts_with_the_two_commands():
    head = README.read_text().splitlines()[:6]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)


def test_pages_link_to_pages_that_exist():
    for page in PAGES:
        for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def _subcommands() -> set[str]:
    import argparse

    from dyndq import cli

    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_command_has_a_transcript_in_the_docs_and_a_line_in_the_readme():
    """docs/cli.md (or the page of its subject) shows each command run; the README lists each."""
    shown = {argv[0] for page in DOCS for language, body in fences(page.read_text()) if language == ""
             for argv, _, _ in commands(body)}
    readme = README.read_text()
    for command in sorted(_subcommands()):
        assert command in shown, f"no docs page shows `dyndq {command}` run"
        assert f"`dyndq {command}" in readme, f"the README's command table lacks `dyndq {command}`"
