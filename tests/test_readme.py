"""The README's Python examples run, in order, in one namespace, as a reader would paste them."""
import contextlib
import io
import re
import sys
import types
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_starts_with_the_two_commands():
    head = README.read_text().splitlines()[:6]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)


def printed_claims(block: str) -> list[str]:
    """What the README says a print shows: the comment lines right after a print(...) call."""
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


def test_readme_examples_run_and_print_what_they_say(tmp_path, monkeypatch):
    blocks = python_blocks()
    assert blocks
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    # one module, as a reader's session would be (onnxscript looks the module of a function up)
    module = types.ModuleType("readme")
    monkeypatch.setitem(sys.modules, "readme", module)
    namespace = module.__dict__
    for i, block in enumerate(blocks):
        # a real file, so that tools reading a function's source (onnxscript's @script) find it
        path = tmp_path / f"readme_block_{i}.py"
        path.write_text(block)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            exec(compile(block, str(path), "exec"), namespace)
        shown = " ".join(stdout.getvalue().split())
        for claim in printed_claims(block):
            assert claim in shown, f"README block {i} says a print shows {claim!r}; it showed {shown!r}"
