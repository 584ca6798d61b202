"""The house's dependency rule (README, "The house"): dependencies point one way.

opdefs/ needs nothing but the standard library, NumPy and ml_dtypes (the dtype
table); kernels/ and shape_inference/ need nothing but those and dyndq.opdefs
(no onnx, no onnxruntime), so the kernel and the shape rules run wherever NumPy
does; converters/ may use onnx but nothing of the face (dyndq/).
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
    "converters": {"numpy", "onnx", "dyndq.opdefs"},
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
