"""The house's dependency rule (DESIGN.md section 2): dependencies point one way.

opdefs/ needs nothing but the standard library; kernels/ and shape_inference/
need nothing but NumPy and dyndq.opdefs (no onnx, no onnxruntime), so the
kernel and the shape rules run wherever NumPy does.
"""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "opdefs": set(),
    "shape_inference": {"dyndq.opdefs"},
    "kernels": {"numpy", "dyndq.opdefs"},
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_what_it_may(folder):
    files = sorted((ROOT / folder).glob("*.py"))
    assert files
    for path in files:
        for name in imports(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            assert any(name == a or name.startswith(a + ".") for a in ALLOWED[folder]), (
                f"{path.relative_to(ROOT)} imports {name}; {folder}/ may import only {sorted(ALLOWED[folder]) or 'the standard library'}")
