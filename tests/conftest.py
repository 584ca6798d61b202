import sys

import dyndq

# tests/ is on sys.path (pyproject.toml's pythonpath), so that the shared table of cases and helpers
# (tests/cases/, a package) imports as `cases`, and the LLM-shaped model of the int4 bridge's tests
# (tests/decoder.py) as `decoder`.  tests/dyndq/ mirrors the package: having no __init__.py it is a
# namespace portion, which Python's import takes only where no regular package dyndq is found; an
# install that leaves dyndq to an import hook after that search (setuptools' default editable mode)
# would get the empty folder, so the run stops here saying so.
if getattr(dyndq, "__file__", None) is None:
    sys.exit(f"dyndq imports as {list(dyndq.__path__)}, a folder of tests, not the package: install it "
             "with `make install` (pip's compat editable mode) or as a regular package")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# No example database: it would be a folder in the source tree, where no test writes.  The default
# profile draws the same examples on every run (a CI run passes or fails for the code, not for
# the draw); `pytest --hypothesis-profile explore` draws new ones each run, to look for more.
settings.register_profile("dyndq", database=None, derandomize=True)
settings.register_profile("explore", database=None)
settings.load_profile("dyndq")

from cases import REQUIRE_NATIVE_ENV, native_required, needs_native, why_not_native  # noqa: E402
from engines import needs_openvino, needs_torch  # noqa: E402
from dyndq.kernels import native  # noqa: E402


def pytest_report_header(config):
    return native.summary()


def pytest_sessionstart(session):
    why = why_not_native()
    if why and native_required():
        pytest.exit(f"{REQUIRE_NATIVE_ENV}=1, but {why}", returncode=1)


_NOT_RUN: list = []  # compiled-kernel tests left out, and why


def pytest_collection_modifyitems(config, items):
    """Where the compiled kernel cannot run, its tests (marked `native`, or on kernel_path's
    compiled paths) are left out here, and one line of the summary says how many and why."""
    why = why_not_native()
    if not why:
        return
    out = [item for item in items if item.get_closest_marker("native") is not None]
    if out:
        items[:] = [item for item in items if item.get_closest_marker("native") is None]
        config.hook.pytest_deselected(items=out)
        _NOT_RUN[:] = [len(out), why]


def pytest_terminal_summary(terminalreporter):
    if _NOT_RUN:
        count, why = _NOT_RUN
        terminalreporter.write_line(f"compiled-kernel tests: {count} not run, the NumPy kernel tested alone: {why}")


@pytest.fixture(autouse=True)
def _compiled_kernel_available(request):
    """Tests marked `native` need the compiled kernel (see cases.needs_native)."""
    if request.node.get_closest_marker("native") is not None:
        needs_native()


@pytest.fixture(autouse=True)
def _openvino_available(request):
    """Tests marked `openvino` need OpenVINO, an optional extra: skipped, saying how to run them,
    where it is not installed (engines.needs_openvino)."""
    if request.node.get_closest_marker("openvino") is not None:
        needs_openvino()


@pytest.fixture(autouse=True)
def _torch_available(request):
    """Tests marked `torch` need torch and torchao, an optional extra: skipped, saying how to run
    them, where they are not installed (engines.needs_torch)."""
    if request.node.get_closest_marker("torch") is not None:
        needs_torch()
