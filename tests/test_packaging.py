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


# -- the Makefile's .venv: one a first `make` left broken is made again -------------------------------

# Stand-ins for Python, so the Makefile's own recipes run here in a moment and without a network:
# the interpreter the Makefile is given (it answers the version check and makes a venv whose
# python works), and each venv's python (it logs what it is asked and answers `import pip`).
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "{log}"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && cp "{venv_python}" "$3/bin/python" && chmod +x "$3/bin/python"
fi
"""
VENV_PYTHON = """#!/bin/sh
echo "venv $*" >> "{log}"
"""
NO_PIP_PYTHON = """#!/bin/sh
case "$*" in *"import pip"*) echo "No module named pip" >&2; exit 1;; esac
echo "broken venv $*" >> "{log}"
exit 1
"""


@pytest.fixture
def makefile_folder(tmp_path):
    """The Makefile in a folder of its own, beside empty files of the names its stamp depends on."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    shutil.copy(ROOT / "Makefile", tmp_path)
    (tmp_path / "kernels").mkdir()
    for name in ("pyproject.toml", "setup.py", "kernels/_native.c"):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))  # (older than any stamp made here)
    log = tmp_path / "log"
    for name, text in (("python", FAKE_PYTHON), ("venv-python", VENV_PYTHON), ("no-pip-python", NO_PIP_PYTHON)):
        (tmp_path / name).write_text(text.format(log=log, venv_python=tmp_path / "venv-python"))
        (tmp_path / name).chmod(0o755)
    return tmp_path


def _make(folder, target="install"):
    """Runs `make TARGET` with the stand-in Python; (exit code, what the Pythons were asked, output)."""
    log = folder / "log"
    log.write_text("")
    out = subprocess.run(["make", "--no-print-directory", target, f"PYTHON={folder / 'python'}"], cwd=folder,
                         capture_output=True, text=True)
    return out.returncode, log.read_text().splitlines(), out.stdout + out.stderr


def _venv(folder, python: str, stamp: bool) -> None:
    (folder / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(folder / python, folder / ".venv" / "bin" / "python")
    if stamp:
        (folder / ".venv" / ".installed").write_text("")


@pytest.mark.parametrize("stamp", [False, True], ids=["stopped-before-the-stamp", "stamp-left-behind"])
@pytest.mark.parametrize("python", ["no-pip-python", None], ids=["python-without-pip", "no-python"])
def test_make_makes_a_broken_venv_again(makefile_folder, python, stamp):
    if python is None:  # (a venv folder whose python was never written, or does not run)
        (makefile_folder / ".venv").mkdir()
        if stamp:
            (makefile_folder / ".venv" / ".installed").write_text("")
    else:
        _venv(makefile_folder, python, stamp)
    code, asked, output = _make(makefile_folder)
    assert code == 0, output
    assert "python -m venv .venv" in asked, asked  # made again...
    assert any(a.startswith("venv -m pip install") for a in asked), asked  # ...and installed into
    assert not any(a.startswith("broken venv") for a in asked), asked
    assert ".venv does not work (its python does not run, or has no pip): making it again" in output
    assert (makefile_folder / ".venv" / ".installed").exists()


def test_make_keeps_a_working_venv(makefile_folder):
    _venv(makefile_folder, "venv-python", stamp=True)
    code, asked, output = _make(makefile_folder)
    assert code == 0 and "Nothing to be done" in output, output
    assert asked == ["venv -c import pip"]  # (the one question: does it work?)
    (makefile_folder / ".venv" / ".installed").unlink()  # a stamp out of date: installed again, in the same venv
    code, asked, output = _make(makefile_folder)
    assert code == 0, output
    assert "python -m venv .venv" not in asked and any(a.startswith("venv -m pip install") for a in asked), asked


def test_a_fresh_clone_gets_its_venv(makefile_folder):
    code, asked, output = _make(makefile_folder)
    assert code == 0, output
    assert "python -m venv .venv" in asked and "making it again" not in output
    assert (makefile_folder / ".venv" / ".installed").exists()
