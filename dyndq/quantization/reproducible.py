"""The quantizer's float64 sums made the same at any thread count: NumPy's BLAS held to one thread.

The data-aware methods choose codes by comparing float64 sums (X^T X products, GPTQ's Cholesky
factor and updates, awq's and scale estimation's errors per candidate), and a near tie between two
candidates is decided by their last bits.  NumPy's BLAS (OpenBLAS in NumPy's wheels) splits some
of its routines over threads, and the split changes the order of the sums: measured with NumPy
2.4's OpenBLAS, 1 thread against 2 (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS), np.linalg.cholesky
of 512 x 512, a [300, 1536] @ [1536] product, a [1536, 300] @ [300, 768] product and a dot of
more than 10 000 elements each differ in their last bits, where X^T X of the same rows does not.
So the same call, the same model and samples, wrote other codes on a machine with other cores or
under another OMP_NUM_THREADS (docs/quantize.md, "Reproducible").

`one_blas_thread()` holds BLAS to one thread for the quantizer's work, through threadpoolctl (the
field's own control of the BLAS and OpenMP pools NumPy loaded, whichever BLAS that is), and gives
the caller's limits back after.  With one thread each routine sums in the one order its kernel
has, so the codes depend on the BLAS library and the CPU's kernel it chose (a machine with
AVX-512 runs other kernels than one with AVX2 only), not on the thread count or the process.
ONNX Runtime, which computes the activations, is not affected: its CPU kernels split work over
the rows and columns of an output, not along a sum, and measured at 1 and 2 intra-op threads
the statistics collected were the same bits.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def one_blas_thread():
    """BLAS (and the OpenMP pool NumPy's BLAS may use) held to one thread inside the block."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
