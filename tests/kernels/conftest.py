import pytest

from dyndq.kernels import native
from dyndq.kernels.parallel import NATIVE_ENV, TUNING, switched_off, tuned


@pytest.fixture(scope="module", params=["compiled", "compiled-streaming", "numpy"])
def kernel_path(request):
    """Run a module's tests on both kernels: the compiled one (kernels/_native.c), also with
    every output written by its non-temporal stores (TUNING.stream_min 0), and the NumPy one. Where the compiled one was not built, its half fails and says why, unless
    DYNDQ_NATIVE=0 says the NumPy kernel alone is wanted."""
    if request.param.startswith("compiled"):
        if not native.built():
            if switched_off(NATIVE_ENV):
                pytest.skip(f"{NATIVE_ENV}=0: the NumPy kernel alone")
            pytest.fail("the compiled kernel kernels/_native.c was not built (is there a C compiler? "
                        "`pip install -e .` prints why); set DYNDQ_NATIVE=0 to test the NumPy kernel alone")
    stream_min = 0 if request.param == "compiled-streaming" else TUNING.stream_min
    with tuned(native=request.param.startswith("compiled"), stream_min=stream_min):
        yield request.param
