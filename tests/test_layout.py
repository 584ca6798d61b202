"""The house's dependency rule (README, "The house"): dependencies point one way.

opdefs/ needs nothing but the standard library, NumPy and ml_dtypes (the dtype
table); kernels/ and shape_inference/ need nothing but those and dyndq.opdefs
(no onnx, no onnxruntime), so the kernel and the shape rules run wherever NumPy
does; dyndq/plumbing/ (ONNX plumbing) may use onnx and dyndq.opdefs; converters/ may use
onnx and the plumbing but nothing of the face (dyndq/).  And no module of the package
imports, at any depth, a module that imports it back.

Within dyndq/, the face modules (dyndq/*.py: check, export, lift, run, the files) and its
subpackages stand in this order, each importing only what stands below it (`RANKS`):

    6  __main__       python -m dyndq
    5  cli/           the commands: may use everything below
    4  verification/  dyndq.verify, a quantized model against its source: reads checkpoints (2), runs
                      the engines (the face), compares codes with quantization's round to nearest (3)
    3  quantization/  quantize, evaluate, budget (writes oneDNN graphs: --emit onednn)
    2  parity/        engines compared     onednn/  the oneDNN graph writer
       checkpoints/   quantized checkpoints read (GGUF)   (none of the three uses another)
    1  the face       dyndq/*.py and dyndq/__init__.py (one another freely)
    0  below          plumbing/, converters/, opdefs/, kernels/, shape_inference/ (ALLOWED above)

A module of a subpackage may import its own subpackage and what ranks lower, never one of its
rank or above: parity/, onednn/ and checkpoints/ stay apart, quantization/ never reaches cli/ or parity/.

And the tests' own layout: helpers are shared through tests/cases/ (and conftest.py), never by
importing or loading another test module or a benchmark; names and docstrings say what is
tested, never which issue asked.
"""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "opdefs": {"numpy", "ml_dtypes"},
    "shape_inference": {"dyndq.opdefs"},
    "kernels": {"numpy", "ml_dtypes", "dyndq.opdefs"},
    "converters": {"numpy", "onnx", "dyndq.opdefs", "dyndq.plumbing"},
    "dyndq/plumbing": {"numpy", "onnx", "google.protobuf", "dyndq.opdefs"},
}


def imports(path: Path, package: str = "") -> set[str]:
    """The modules a file imports, anywhere in it (relative imports resolved against `package`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and package:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            if node.module:
                found.add(f"{base}.{node.module}")
            else:
                found |= {f"{base}.{a.name}" for a in node.names}
    return found


def package_modules() -> dict[str, Path]:
    """dyndq.* module name -> its file, the part folders mapped as the install maps them."""
    out = {}
    for top in ("dyndq", "opdefs", "kernels", "shape_inference", "converters"):
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[0] != "dyndq":
                parts.insert(0, "dyndq")
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_what_it_may(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files
    for path in files:
        for name in imports(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            assert any(name == a or name.startswith(a + ".") for a in ALLOWED[folder]), (
                f"{path.relative_to(ROOT)} imports {name}; {folder}/ may import only {sorted(ALLOWED[folder]) or 'the standard library'}")


def module_imports() -> tuple[dict[str, set[str]], dict[str, Path]]:
    """module -> the package's modules it imports (function-local imports too), and the modules."""
    modules = package_modules()
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for imported in imports(path, package):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name_is_parent(name, imported):
                targets.add(imported)
        edges[name] = targets
    return edges, modules


def test_the_import_graph_has_no_circle():
    """Follow every import between modules of the package (function-local ones too): no module
    reaches itself.  (A package's __init__ importing its own submodules is not a circle.)"""
    edges, _ = module_imports()
    state, circle = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if name_is_parent(nxt, node):
                continue
            if state.get(nxt) == "open":
                circle.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not circle, "import circles: " + "; ".join(" -> ".join(c) for c in circle)


def name_is_parent(package: str, module: str) -> bool:
    return module.startswith(package + ".")


FACE = "the face"
RANKS = {"plumbing": 0, "converters": 0, "opdefs": 0, "kernels": 0, "shape_inference": 0,
         FACE: 1, "parity": 2, "onednn": 2, "checkpoints": 2, "quantization": 3, "verification": 4, "cli": 5, "__main__": 6}


def part_of(module: str, modules: dict[str, Path]) -> str:
    """The part of dyndq a module belongs to: its subpackage's name, FACE for dyndq/*.py and the
    package itself, "__main__"."""
    parts = module.split(".")
    if len(parts) == 1 or (modules[module].parent == ROOT / "dyndq" and parts[1] != "__main__"):
        return FACE
    return parts[1]


def against_the_ranks(edges: dict[str, set[str]], modules: dict[str, Path]) -> list[str]:
    """Each import (module -> module imported) that does not point to a lower rank or within its own
    part.  (What the parts of rank 0 import among themselves is ALLOWED's to say.)"""
    wrong = []
    for name, targets in sorted(edges.items()):
        mine = part_of(name, modules)
        if RANKS[mine] == 0:
            continue
        for target in sorted(targets):
            theirs = part_of(target, modules)
            if theirs == mine:
                continue
            if RANKS[theirs] >= RANKS[mine]:
                wrong.append(f"{name} ({mine}, rank {RANKS[mine]}) imports {target} ({theirs}, rank {RANKS[theirs]})")
    return wrong


def test_every_part_of_dyndq_has_a_rank():
    _, modules = module_imports()
    assert {part_of(m, modules) for m in modules} == set(RANKS)


def test_the_face_and_dyndqs_subpackages_import_only_what_ranks_below_them():
    edges, modules = module_imports()
    wrong = against_the_ranks(edges, modules)
    assert not wrong, "imports against the order of tests/test_layout.py's RANKS:\n" + "\n".join(wrong)


def test_the_rank_guard_refuses_an_import_upward_and_one_between_equals():
    _, modules = module_imports()
    made_up = {"dyndq.onednn": {"dyndq.parity"}, "dyndq.quantization": {"dyndq.cli"}, "dyndq.checker": {"dyndq.onednn"},
               "dyndq.cli": {"dyndq.quantization", "dyndq.checker"}}
    assert [w.split(" imports ")[0] for w in against_the_ranks(made_up, modules)] == [
        "dyndq.checker (the face, rank 1)", "dyndq.onednn (onednn, rank 2)", "dyndq.quantization (quantization, rank 3)"]


def test_kernels_and_shape_rules_import_and_run_without_onnx():
    """With onnx and onnxruntime made unimportable, dyndq, its kernels and its shape rules still work."""
    import subprocess

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('onnx', 'onnxruntime'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np, dyndq\n"
        "from dyndq import kernels, shape_inference\n"
        "print(dyndq.dynamic_dequantize(np.array([3], np.int8), np.array([0.5], np.float32)))\n"
        "print(dyndq.DYNAMIC_DEQUANTIZE_1.shape_inference(dyndq.TensorSpec('int8', (2,)), dyndq.TensorSpec('float32', (1,))))\n"
        "assert not any(m.split('.')[0] in ('onnx', 'onnxruntime') for m in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1.5]", "float32[2]"]


# -- the tests' own layout ------------------------------------------------------------------------

TESTS = ROOT / "tests"


def _test_files():
    return sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)


def test_tests_share_helpers_only_through_the_helpers_modules():
    """No test imports another test module, nor loads one (or a benchmark script) by file: what tests
    share lives in tests/cases/ (or tests/conftest.py); benchmarks run as scripts."""
    test_modules = {p.stem for p in _test_files() if p.name.startswith("test_")}
    for path in _test_files():
        rel = str(path.relative_to(ROOT))
        for name in imports(path):
            top = name.split(".")[0]
            assert top not in test_modules and not top.startswith("test_"), f"{rel} imports the test module {name}"
            assert top not in {"benchmarks"} and not top.startswith("bench_"), f"{rel} imports a benchmark ({name})"
        if path != Path(__file__).resolve():
            assert "spec_from_file_location" not in path.read_text(), f"{rel} loads a module by file"


def test_test_names_and_docstrings_say_what_is_tested_not_which_issue_asked():
    import re

    ticket = re.compile(r"(?i)\bissues?\s*#?\d+|(?<![\w/])#\d+\b")
    for path in _test_files():
        tree = ast.parse(path.read_text())
        named = [(path.name, ast.get_docstring(tree) or "")]
        named += [(n.name, ast.get_docstring(n) or "") for n in ast.walk(tree)
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        for name, doc in named:
            assert not ticket.search(name) and not ticket.search(doc), f"{path.relative_to(ROOT)}: {name} cites an issue"
