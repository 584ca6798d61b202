"""The optional compiled kernel (kernels/_native.c); everything else is in pyproject.toml.

optional=True: a machine without a C compiler still installs, and the NumPy kernels
run (kernels/native.py).  -ffp-contract=off: no fused multiply-add may change a bit
of the float32 arithmetic.  -g0: no debug information (Python's own flags ask for it),
which made the module six times its size.  (setup.py rather than pyproject's ext-modules table,
which setuptools still calls experimental.)
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dyndq.kernels._native",
            ["kernels/_native.c"],
            depends=["kernels/_native_scalar.h", "kernels/_native_x86.h", "kernels/_native_fused.h"],
            optional=True,
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-g0"],
        )
    ]
)
