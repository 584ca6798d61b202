import contextlib

import pytest

from dyndq.kernels import native
from dyndq.kernels.parallel import NATIVE_ENV, TUNING, switched_off, tuned

# The compiled kernel's paths: at this CPU's level (AVX-512's fused loops where it has it),
# streaming every output, and at each lower level this CPU can stand in for (AVX2/F16C, plain C).
PATHS = ["compiled", "compiled-streaming", "compiled-level-1", "compiled-level-0", "numpy"]


@pytest.fixture(scope="module", params=PATHS)
def kernel_path(request):
    """Run a module's tests on every path of both kernels: the compiled one (kernels/_native.c)
    at this CPU's level, the same with every output written by its non-temporal stores
    (TUNING.stream_min 0), at each lower level, and the NumPy kernel."""
    path = request.param
    if path.startswith("compiled") and not native.built():
        if switched_off(NATIVE_ENV):
            pytest.skip(f"{NATIVE_ENV}=0: the NumPy kernel alone")
        pytest.fail("the compiled kernel kernels/_native.c was not built (is there a C compiler? "
                    "`pip install -e .` prints why); set DYNDQ_NATIVE=0 to test the NumPy kernel alone")
    level = int(path[-1]) if path.startswith("compiled-level") else None
    if level is not None and level >= native.cpu_level():
        pytest.skip(f"level {level} is this CPU's own: the 'compiled' path")
    stream_min = 0 if path == "compiled-streaming" else TUNING.stream_min
    with contextlib.ExitStack() as stack:
        if level is not None:
            stack.enter_context(native.at_level(level))
        stack.enter_context(tuned(native=path.startswith("compiled"), stream_min=stream_min))
        yield path
