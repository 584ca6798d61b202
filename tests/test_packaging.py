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


# -- importable from the clone: its root, and its parent folder (the clone named dyndq) -------------

IMPORT = "import dyndq; dyndq.run; dyndq.export; print(dyndq.opdefs.__file__)"


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A folder holding the clone under the name dyndq (as `git clone .../dyndq` leaves it), so
    that its parent is where a user stands right after cloning."""
    folder = tmp_path_factory.mktemp("parent")
    (folder / "dyndq").symlink_to(ROOT)
    return folder


def _regular(wheel, tmp_path_factory):
    """A regular install of the wheel, and the command that runs Python on it without this
    environment's editable install (-S: no .pth files; the dependencies by PYTHONPATH)."""
    import numpy

    target = tmp_path_factory.mktemp("regular")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    deps = os.path.dirname(os.path.dirname(numpy.__file__))
    return [sys.executable, "-S"], dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), deps]))


@pytest.fixture(scope="module")
def installs(wheel, tmp_path_factory):
    """(name, python command, environment) for each way dyndq is installed here."""
    found = [("regular", *_regular(wheel, tmp_path_factory))]
    urls = [d.read_text("direct_url.json") for d in metadata.distributions(name="dyndq")]
    if any(u and json.loads(u).get("dir_info", {}).get("editable") for u in urls):
        found.append(("editable", [sys.executable], dict(os.environ)))
    return found


def _readme_quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("where", ["root", "parent"])
def test_import_dyndq_from_the_clone_and_its_parent(installs, parent, where):
    cwd = ROOT if where == "root" else parent
    for name, python, env in installs:
        out = subprocess.run([*python, "-c", IMPORT], cwd=cwd, env=env, capture_output=True, text=True)
        assert out.returncode == 0, (name, where, out.stderr[-2000:])
        assert out.stdout.strip().endswith(os.path.join("opdefs", "__init__.py")), (name, where, out.stdout)


@pytest.mark.parametrize("where", ["root", "parent"])
def test_python_dash_m_pytest_from_the_clone_and_its_parent(installs, parent, where):
    cwd, test = (ROOT, "tests/opdefs/test_registry.py") if where == "root" else (parent, "dyndq/tests/opdefs/test_registry.py")
    for name, python, env in installs:
        out = subprocess.run([*python, "-m", "pytest", "-q", test], cwd=cwd, env=env, capture_output=True, text=True)
        assert out.returncode == 0, (name, where, out.stdout[-2000:], out.stderr[-2000:])


@pytest.mark.parametrize("where", ["root", "parent"])
def test_the_readme_quick_start_from_the_clone_and_its_parent(installs, parent, where):
    """As a script in that folder would run it (python -c: the folder first on sys.path)."""
    for name, python, env in installs:
        out = subprocess.run([*python, "-c", _readme_quick_start()], cwd=ROOT if where == "root" else parent, env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0, (name, where, out.stderr[-2000:])
