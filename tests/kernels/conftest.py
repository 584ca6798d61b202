import contextlib

import pytest

from cases import needs_native
from dyndq.kernels import native
from dyndq.kernels.parallel import TUNING, tuned

# The kernel's paths: the compiled one at this CPU's level (AVX-512's fused loops where it has it),
# the same streaming every output, each lower level this CPU can stand in for (AVX2/F16C, plain
# C), and the NumPy kernel.
PATHS = ["compiled", "compiled-streaming", "compiled-level-1", "compiled-level-0", "numpy"]
VARIANTS = ["scalar", "avx2", "avx512"]  # the variant each level's table holds (kernels/_native.c)


def _counted(fn, calls):
    def counting(*args, **kwargs):
        calls.append(fn.__name__)
        return fn(*args, **kwargs)

    return counting


@pytest.fixture(scope="module", params=[pytest.param(p, marks=pytest.mark.native) if p.startswith("compiled") else p
                                        for p in PATHS])
def kernel_path(request):
    """Run a module's tests on every path of both kernels: the compiled one (kernels/_native.c)
    at this CPU's level, the same with every output written by its non-temporal stores
    (TUNING.stream_min 0), at each lower level, and the NumPy kernel.

    Each path is checked to be what ran: a compiled path runs the variant its level names (the C
    side's own table says so) and calls the compiled kernel at least once in the module; the
    NumPy path never calls it."""
    path = request.param
    compiled = path.startswith("compiled")
    if compiled:
        needs_native()
    level = int(path[-1]) if path.startswith("compiled-level") else None
    if level is not None and level >= native.cpu_level():
        pytest.skip(f"level {level} is the kernel's own here: the 'compiled' path" if level == native.cpu_level()
                    else f"no level {level} here (this CPU, or a build without it: native.info())")
    stream_min = 0 if path == "compiled-streaming" else TUNING.stream_min
    calls: list[str] = []
    with contextlib.ExitStack() as stack:
        if level is not None:
            stack.enter_context(native.at_level(level))
        if native.built():
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            for entry in ("dequantize", "dequantize_one"):
                patch.setattr(native._native, entry, _counted(getattr(native._native, entry), calls))
        stack.enter_context(tuned(native=compiled, stream_min=stream_min))
        if compiled:
            want = VARIANTS[native.cpu_level() if level is None else level]
            assert native.info()["entries"]["dequantize"] == want, native.info()
        yield path
        assert bool(calls) == compiled, f"{path}: the compiled kernel was called {len(calls)} times"
