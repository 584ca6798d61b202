import importlib.util
import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))

# tests/dyndq/ mirrors the dyndq/ folder; were tests/ on sys.path (as it is when
# pytest is started from inside tests/), it would shadow the real dyndq package
# as a namespace package. So tests/ never stays on sys.path...
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _TESTS]

# ...and the shared table of cases (tests/cases.py) is loaded by file, as `cases` (and the
# LLM-shaped model of the int4 bridge's tests, tests/decoder.py, as `decoder`; the quantizer's
# float models, tests/quantization/models.py, as `quantize_models`).
for _name, _file in (("cases", "cases.py"), ("decoder", "decoder.py"), ("quantize_models", "quantization/models.py")):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, os.path.join(_TESTS, _file))
        sys.modules[_name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_name])

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# No example database: it would be a folder in the source tree, where no test writes.  The default
# profile draws the same examples on every run (a CI run passes or fails for the code, not for
# the draw); `pytest --hypothesis-profile explore` draws new ones each run, to look for more.
settings.register_profile("dyndq", database=None, derandomize=True)
settings.register_profile("explore", database=None)
settings.load_profile("dyndq")

from cases import REQUIRE_NATIVE_ENV, native_required, needs_native, why_not_native  # noqa: E402
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
