"""`pip install .` and `pip install -e .` both give one `dyndq` namespace, and nothing else.

The wheel is built from a copy of the source tree (no test writes into the repository), with
the compiled kernel `make test`'s install already compiled put in it (setup.py,
DYNDQ_PREBUILT_NATIVE): the C module is compiled once per `make test`."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from dyndq.kernels import native

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("opdefs", "shape_inference", "kernels", "converters")

PROBE = (
    "import json, dyndq, dyndq.opdefs, dyndq.shape_inference, dyndq.kernels, dyndq.converters, onnx.defs\n"
    "mods = {m: __import__('dyndq.' + m, fromlist=['_']).__file__ for m in %r}\n"
    "mods['dyndq'] = dyndq.__file__\n"
    "mods['registered'] = onnx.defs.has('DynamicDequantize', 1, dyndq.DOMAIN)\n"
    "print(json.dumps(mods))\n" % (PARTS,)
)


_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
                                     ".pytest_cache", "dyndq-demo", "*.so", "*.pyd")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    source = tmp_path_factory.mktemp("source") / "dyndq"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ)
    if native.built():
        env["DYNDQ_PREBUILT_NATIVE"] = native.info()["module"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
                   check=True, capture_output=True, env=env)
    [whl] = out.glob("dyndq-*.whl")
    return whl


def test_wheel_installs_only_under_dyndq(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"dyndq", next(t for t in tops if t.endswith(".dist-info"))}
    for part in PARTS:
        assert f"dyndq/{part}/__init__.py" in names
    assert not any(n.startswith(("kernels/", "converters/", "opdefs/", "shape_inference/")) for n in names)
    if native.built():  # the compiled kernel, in the wheel
        assert any(n.startswith("dyndq/kernels/_native.") and n.endswith((".so", ".pyd")) for n in names), names


def test_regular_install_imports_from_site_packages(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    mods = json.loads(out.stdout)
    assert mods.pop("registered") is True
    for name, path in mods.items():
        assert path.startswith(str(target / "dyndq")), (name, path)
    assert not (target / "kernels").exists()


def test_editable_install_maps_the_parts_to_the_repository_folders(tmp_path):
    # (metadata.distribution would pick up the dyndq.egg-info a build leaves in the repository)
    urls = [d.read_text("direct_url.json") for d in metadata.distributions(name="dyndq")]
    if not any(u and json.loads(u).get("dir_info", {}).get("editable") for u in urls):
        pytest.skip("dyndq is not installed editable here (make test installs it with -e)")
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, check=True)
    mods = json.loads(out.stdout)
    assert mods.pop("registered") is True
    assert mods["dyndq"] == str(ROOT / "dyndq" / "__init__.py")
    for part in PARTS:
        assert mods[part] == str(ROOT / part / "__init__.py")
