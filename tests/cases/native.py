"""The compiled kernel: whether its tests run, and how many examples a property test draws on
each kernel path."""
from __future__ import annotations

# Tests of the compiled kernel carry the `native` mark (or take kernel_path's compiled paths).
# Where it is not built (no C compiler at install) or switched off (DYNDQ_NATIVE=0) they are
# skipped from the one line in needs_native, so that pytest's summary says why in one line;
# with DYNDQ_REQUIRE_NATIVE=1 (as .ci/run sets it) a missing compiled kernel ends the run as a
# failure instead (tests/conftest.py), so CI can never skip it silently.
REQUIRE_NATIVE_ENV = "DYNDQ_REQUIRE_NATIVE"


def native_required() -> bool:
    """Whether DYNDQ_REQUIRE_NATIVE is set and not to an off value (parallel.switched_off's words)."""
    import os

    from dyndq.kernels.parallel import switched_off

    return bool(os.environ.get(REQUIRE_NATIVE_ENV)) and not switched_off(REQUIRE_NATIVE_ENV)


def why_not_native() -> str | None:
    """Why the compiled-kernel tests cannot run here (None: they can)."""
    from dyndq.kernels import native
    from dyndq.kernels.parallel import NATIVE_ENV, switched_off

    if not native.built():
        return f"the compiled kernel is {native.info()['why']}"
    if switched_off(NATIVE_ENV):
        return f"{NATIVE_ENV}=0 switches the compiled kernel off"
    return None


def needs_native() -> None:
    """Skip the calling test unless the compiled kernel can run (the one place that says why)."""
    import pytest

    why = why_not_native()
    if why:
        pytest.skip(f"compiled-kernel tests skipped, the NumPy kernel is tested alone: {why}")


def budget(path: str, full: int) -> int:
    """A property test's number of examples on a kernel path (tests/kernels/conftest.py,
    kernel_path): the full budget on the path that serves calls here (the compiled kernel at
    this CPU's level where it runs, else the NumPy kernel), a tenth (at least 25) on the others,
    which the same properties cover at the serving path's full budget."""
    serving = "compiled" if why_not_native() is None else "numpy"
    return full if path == serving else max(25, full // 10)
