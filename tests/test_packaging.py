"""`pip install .` and `pip install -e .` both give one `dyndq` namespace, every package of the
tree in it, and nothing else; a regular install runs every command.

The wheel is built from a copy of the source tree (no test writes into the repository), with
the compiled kernel `make test`'s install already compiled put in it (setup.py,
DYNDQ_PREBUILT_NATIVE): the C module is compiled once per `make test`.  It is installed once,
into a fresh venv (the `installed` fixture), which the tests of a regular install share."""
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


def tree_packages() -> set[str]:
    """Every package of the source tree, found by walking it: each folder holding Python under
    dyndq/ or under a part folder (a folder at the top with an __init__.py, installed under
    dyndq), so a new folder is covered here without editing this test."""
    tops = {"dyndq": "dyndq"} | {d.name: f"dyndq.{d.name}" for d in ROOT.iterdir()
                                 if d.name != "dyndq" and (d / "__init__.py").is_file()}
    found = set()
    for top, package in tops.items():
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if any(f.endswith(".py") for f in files):
                found.add(".".join([package, *Path(folder).relative_to(ROOT / top).parts]))
    return found


def test_the_tree_has_the_part_folders_and_subpackages():  # (so the walk above finds something to check)
    assert {"dyndq", "dyndq.parity", "dyndq.converters.contrib"} | {f"dyndq.{p}" for p in PARTS} <= tree_packages()


def test_the_wheel_holds_every_package_of_the_tree(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {os.path.dirname(n).replace("/", ".") for n in names if n.endswith(".py")}
    assert packages == tree_packages()


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(venv folder, environment): the wheel installed into a fresh venv, as `pip install .` would.

    The venv is made without pip (fast), and the running environment's pip installs the wheel into
    it (`pip --python`).  Its dependencies (numpy, onnx, onnxruntime, ...; pytest for the tests
    run from it) are not fetched again: a .pth file in its site-packages names the running
    environment's site-packages, written after the install (pip would otherwise see the editable
    dyndq there).  A .pth line adds that folder to sys.path, after the venv's own site-packages,
    without reading the .pth files in it, so the editable install's (the clone's root on sys.path)
    stays out: `import dyndq` finds only the wheel's files, and the bare part names nothing."""
    import site

    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True)
    ask = "import site, sys; print(site.getsitepackages()[0])"
    venv_site = subprocess.run([python, "-c", ask], check=True, capture_output=True, text=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if os.path.isdir(p)]
    (Path(venv_site) / "dependencies_from_the_test_environment.pth").write_text("\n".join(deps) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return venv, env


# Imports every module of every package named on the command line, and prints where each came from.
IMPORT_ALL = """import importlib, importlib.util, json, pkgutil, sys
files = {}
for package in sys.argv[1:]:
    p = importlib.import_module(package)
    files[package] = p.__file__
    for m in pkgutil.iter_modules(p.__path__, package + "."):
        if not m.ispkg and not m.name.endswith(".__main__"):
            files[m.name] = importlib.import_module(m.name).__file__
bare = [name for name in ("opdefs", "shape_inference", "kernels", "converters") if importlib.util.find_spec(name)]
print(json.dumps({"files": files, "bare": bare}))
"""


def test_regular_install_imports_every_package_from_the_venv(installed, tmp_path):
    venv, env = installed
    packages = sorted(tree_packages())
    out = subprocess.run([venv / "bin" / "python", "-c", IMPORT_ALL, *packages], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout)
    assert found["bare"] == []  # (no part installed, or reachable, under its bare name)
    assert set(packages) <= set(found["files"])
    for name, path in found["files"].items():
        assert path.startswith(str(venv)) and "site-packages" in path, (name, path)
    probe = subprocess.run([venv / "bin" / "python", "-c", PROBE], cwd=tmp_path, env=env, capture_output=True,
                           text=True, check=True)
    assert json.loads(probe.stdout)["registered"] is True


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


def test_regular_install_runs_every_command(installed, tmp_path):
    """Each command of the installed console script once, on the demo's small models: exit 0,
    and no internal error (an install missing a module fails here, as dyndq.parity did)."""
    from dyndq.cli import COMMANDS
    from dyndq.demo import float_model
    from dyndq.model_files import save_model

    venv, env = installed
    save_model(float_model(), tmp_path / "float.onnx")  # (the one input no command writes)
    _gguf_of_w1(tmp_path / "w1.gguf")  # (and the checkpoint import-weights reads)
    commands = [  # in order: the demo writes the models the others read
        ["demo", "--out", "demo"],
        ["schema"],
        ["check", "demo/model.onnx"],
        ["check", "--runtime-parity", "demo/model.onnx"],
        ["export", "demo/model.onnx", "exported.onnx"],
        ["lift", "demo/model.exported.onnx", "lifted.onnx"],
        ["run", "demo/model.onnx", "-i", "x=demo/x.npy"],
        ["export-onednn", "--weights-as-inputs", "demo/model.onnx", "graph.json"],
        ["import-onednn", "graph.json", "imported.onnx"],
        ["quantize", "float.onnx", "quantized.onnx"],
        ["import-weights", "float.onnx", "w1.gguf", "-o", "weights.onnx"],
        ["verify", "quantized.onnx", "--against", "float.onnx"],
    ]
    assert {c[0] for c in commands} == set(COMMANDS)  # (a new command gets a line here)
    for command in commands:
        out = subprocess.run([venv / "bin" / "dyndq", *command], cwd=tmp_path, env=env, capture_output=True,
                             text=True)
        said = out.stdout + out.stderr
        assert out.returncode == 0 and "internal error" not in said, (command, out.returncode, said[-3000:])
    for written in ("demo/model.onnx", "exported.onnx", "lifted.onnx", "graph.json", "imported.onnx", "quantized.onnx",
                    "weights.onnx"):
        assert (tmp_path / written).is_file(), written


def _gguf_of_w1(path) -> None:
    """A GGUF file holding the demo's w1 ([64, 128], read by MatMul) as torch stores it, [128, 64], in Q8_0."""
    import numpy as np

    gguf = pytest.importorskip("gguf", reason="the `gguf` package (the test extra installs it: make test)")
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w1", gguf.quants.quantize(np.linspace(-1, 1, 128 * 64, dtype=np.float32).reshape(128, 64), q8),
                      raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- importable from the clone: its root, and its parent folder (the clone named dyndq) -------------

IMPORT = "import dyndq; dyndq.run; dyndq.export; print(dyndq.opdefs.__file__)"


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A folder holding the clone under the name dyndq (as `git clone .../dyndq` leaves it), so
    that its parent is where a user stands right after cloning."""
    folder = tmp_path_factory.mktemp("parent")
    (folder / "dyndq").symlink_to(ROOT)
    return folder


@pytest.fixture(scope="module")
def installs(installed):
    """(name, python command, environment) for each way dyndq is installed here."""
    venv, env = installed
    found = [("regular", [str(venv / "bin" / "python")], env)]
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
    mkdir -p "$3/bin" && cp "{venv_python}" "$3/bin/python" && cp "{folder}/dyndq" "$3/bin/dyndq"
fi
"""
# (the question what the kernel's build will find goes to a real Python: it reads only sysconfig and PATH)
VENV_PYTHON = """#!/bin/sh
echo "venv $*" >> "{log}"
case "$*" in *sysconfig*) exec "{real_python}" "$@";; esac
"""
DYNDQ = """#!/bin/sh
echo "dyndq $*" >> "{log}"
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
    for name, text in (("python", FAKE_PYTHON), ("venv-python", VENV_PYTHON), ("no-pip-python", NO_PIP_PYTHON),
                       ("dyndq", DYNDQ)):
        (tmp_path / name).write_text(text.format(log=log, venv_python=tmp_path / "venv-python", folder=tmp_path,
                                                 real_python=sys.executable))
        (tmp_path / name).chmod(0o755)
    return tmp_path


def _make(folder, target="install", **env):
    """Runs `make TARGET` with the stand-in Python (and ENV); (exit code, what the Pythons were asked, output)."""
    log = folder / "log"
    log.write_text("")
    out = subprocess.run(["make", "--no-print-directory", target, f"PYTHON={folder / 'python'}"], cwd=folder,
                         capture_output=True, text=True, env=dict(os.environ, **env))
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


@pytest.mark.parametrize("compiler", ["no-such-cc", "sh"], ids=["no-compiler", "a-compiler"])
def test_make_demo_says_each_step_as_it_goes(makefile_folder, compiler):
    """One line a step, before the step; no command line and no pip output in between."""
    code, asked, output = _make(makefile_folder, "demo", CC=compiler)
    assert code == 0, output
    install = "installing dyndq with its dependencies and test tools into .venv; "
    kernel = ("no C compiler found (no-such-cc): the NumPy kernel will run, with the same bits",) if compiler != "sh" else (
        "this includes compiling the kernel (kernels/_native.c) with sh: minutes on a busy machine",
        "Python.h not found, so the kernel cannot be compiled: the NumPy kernel will run, with the same bits")
    lines = output.splitlines()
    assert lines[:2] == [f"making the virtual environment .venv ({makefile_folder / 'python'} -m venv .venv)",
                         "upgrading pip and setuptools in .venv"], output
    assert lines[2] in [install + k for k in kernel], output
    assert lines[3:] == ["running the demo (.venv/bin/dyndq demo)"], output
    # ...each said before it is done, and after the install, the kernel it gave (native.summary(): the
    # stand-in Python answers nothing)
    steps = [next(i for i, a in enumerate(asked) if a.startswith(start)) for start in
             ("python -m venv", "venv -m pip install --quiet --upgrade pip", "venv -m pip install --quiet --quiet -e",
              "venv -c from dyndq.kernels import native", "dyndq demo")]
    assert steps == sorted(steps), asked
