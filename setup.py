"""The packages, found in the tree, and the optional compiled kernel (kernels/_native.c);
everything else is in pyproject.toml.

The packages are what setuptools' own discovery (find_packages) finds: dyndq/ and every package
under it, and the design card's four part folders at the top of the repository, each installed
under dyndq (a bare top-level `kernels` or `converters` would collide with unrelated PyPI
packages) with its own subpackages (converters/contrib/ as dyndq.converters.contrib).  Nothing
else installs at the top level.  (Found rather than listed: a hand-kept list in pyproject.toml
left dyndq.parity out of `pip install .`; pyproject's find table cannot put a folder under another
name, and its package-dir would be half of a mapping whose other half lives here.)

optional=True: a machine without a C compiler still installs, and the NumPy kernel
runs (kernels/native.py says which runs and why).  The flags depend on the compiler:
GCC and Clang get -O3, -ffp-contract=off (no fused multiply-add may change a bit of the
float32 arithmetic) and -g0 (no debug information, which made the module six times its
size); MSVC gets /O2 and /fp:precise (which contracts nothing).  The vector variants are
compiled per function for their targets (kernels/_native_port.h), so no -m flag is needed.

DYNDQ_NO_SIMD=1 in the environment builds the plain C variant alone (what a CPU of another
family than x86-64 gets), for testing it.  DYNDQ_PREBUILT_NATIVE=PATH puts that compiled
module in the build instead of compiling one (the packaging test builds a wheel so, from the
module `make test` compiled once).  (setup.py rather than pyproject's ext-modules
table, which setuptools still calls experimental, and cannot choose flags per compiler.)
"""
import os
import shutil

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

PARTS = ("opdefs", "shape_inference", "kernels", "converters")  # the design card's part folders
PACKAGE_DIR = {"dyndq": "dyndq", **{f"dyndq.{part}": part for part in PARTS}}
PACKAGES = find_packages(include=["dyndq", "dyndq.*"]) + [
    f"dyndq.{part}{sub}" for part in PARTS for sub in ["", *(f".{p}" for p in find_packages(part))]]

FLAGS = {
    "msvc": ["/O2", "/fp:precise"],
    "unix": ["-O3", "-ffp-contract=off", "-fno-fast-math", "-g0"],  # GCC and Clang alike
}


class BuildExt(build_ext):
    """build_ext with the flags of the compiler it finds."""

    def build_extensions(self):
        flags = FLAGS.get(self.compiler.compiler_type, [])
        for ext in self.extensions:
            ext.extra_compile_args = flags + ext.extra_compile_args
        super().build_extensions()

    def build_extension(self, ext):
        prebuilt = os.environ.get("DYNDQ_PREBUILT_NATIVE")
        if not prebuilt:
            return super().build_extension(ext)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(prebuilt, target)


no_simd = os.environ.get("DYNDQ_NO_SIMD", "").lower() not in {"", "0", "off", "false", "no"}

setup(
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "dyndq.kernels._native",
            ["kernels/_native.c"],
            depends=[f"kernels/_native_{h}.h" for h in ("port", "scalar", "quantize", "variant", "x86", "fused")],
            define_macros=[("DYNDQ_NO_SIMD", "1")] if no_simd else [],
            optional=True,
        )
    ],
)
