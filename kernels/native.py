"""The compiled kernel (kernels/_native.c), when it was built: one fused pass per element.

NumPy makes a pass per step (cast, subtract, multiply, a dozen for a float16
rounding); _native.c reads each byte of src once and writes each output element
once, which is what memory costs.  It is optional: `pip install` builds it where a
C compiler is found, and without it (or with DYNDQ_NATIVE=0, or TUNING.native
False) the NumPy kernel runs, with the same bits.  `info()` says which runs and why.

This module does what the C side expects done: the view in which the parameters
broadcast (geometry.view, the one the NumPy kernel blocks by), the parameters
contiguous (widened to float32 / int32 where they change at every element and the
kernel runs at level 0), a choice of integer width for the subtraction (from the range
of src's dtype and the zero points'), the table that decodes float codes (float8,
float6, float4: ml_dtypes' own float32 value of each of the 256 bytes, built once per
dtype and checked exact), and every array as its bytes; then it shares the elements
among threads (the C loop releases the GIL).  The kinds it passes are the C side's own
codes (_native.KINDS), by name.

Levels and variants: the C side compiles each entry once per variant, each for its own
target ("scalar": plain C, level 0; "avx2": AVX2 + F16C, level 1; "avx512": AVX-512, level
2), and calls through one table filled for a level: the CPU's at import, or a lower one
named by DYNDQ_CPU_LEVEL=0|1|2 in the environment before import; `at_level(n)` refills it
for a while (tests, `bench_kernel.py --level`); `info()` reads the table.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import warnings

import numpy as np

from dyndq.opdefs import dtypes

from . import parallel
from .geometry import param_count
from .parallel import TUNING as T

CPU_LEVEL_ENV = "DYNDQ_CPU_LEVEL"
# a compiled module to load instead of the installed one (the Makefile's builds with another
# compiler or other flags: test-clang, test-nosimd, test-sanitize)
MODULE_ENV = "DYNDQ_NATIVE_MODULE"


def _load():
    """The compiled module, or None and why not."""
    name = __name__.rsplit(".", 1)[0] + "._native"
    path = os.environ.get(MODULE_ENV)
    try:
        if path:
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        else:
            spec = importlib.util.find_spec(name)
            if spec is None:  # no C compiler when dyndq was installed: the NumPy kernel serves
                return None, f"not built (no compiled module in {os.path.dirname(__file__)}: was a C compiler " \
                             "found when dyndq was installed?)"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, None
    except ImportError as e:  # there, but it does not load
        return None, f"not loadable ({e})"


_native, _why_not = _load()

__all__ = ["built", "handles", "info", "dequantize", "dequantize_one", "cpu_level", "level", "at_level", "narrow",
           "CPU_LEVEL_ENV", "MODULE_ENV"]

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)
_U8 = np.dtype(np.uint8)
_U16 = np.dtype(np.uint16)


def _codes(table: str) -> dict:
    """{numpy dtype: the C side's code} for one of _native.KINDS' tables (dtype names)."""
    return {} if _native is None else {dtypes.by_name(n).numpy: c for n, c in _native.KINDS[table].items()}


_SRC, _DST, _SCALE_KIND, _ZP_KIND, _WIDEN = (_codes(t) for t in ("src", "dst", "scale", "zp", "widen"))
_ZMODE = {} if _native is None else _native.KINDS["zmode"]
_TABLE_KIND = None if _native is None else _native.KINDS["table"]  # src decoded through a table
# |zp| up to this: src - zp fits in int32 for every src of 8 bits or fewer (|src| <= 255)
_NARROW_ZP = 0 if _native is None else _native.NARROW_ZP
# each integer src dtype's (smallest, largest) value: src - zp fits in int32 where both ends do
_RANGE = {d: dtypes.integer_range(d) for d, kind in _SRC.items() if kind != _TABLE_KIND}
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_TABLES: dict = {}  # src dtype -> its decoding table (_table)


def _level_from_environment() -> None:
    """DYNDQ_CPU_LEVEL=0|1|2: fill the table for that level instead of the CPU's (a level above
    the CPU's, or another value, is ignored with a warning that says so)."""
    value = os.environ.get(CPU_LEVEL_ENV)
    if _native is None or value in (None, ""):
        return
    top = _native.cpu_level()
    if value.strip() in {str(n) for n in range(top + 1)}:
        _native.set_level(int(value))
    else:
        warnings.warn(f"{CPU_LEVEL_ENV}={value!r}: this CPU has levels 0 to {top}; the kernel runs at {top}",
                      RuntimeWarning, stacklevel=2)


_level_from_environment()


def info() -> dict:
    """Which kernel runs, and why: whether the compiled one is built (else why not) and switched
    on (TUNING.native, DYNDQ_NATIVE), the CPU's level and the level in force, the variant each
    compiled entry runs (read from the C side's table), the variants built, the compiler, and
    the module's file."""
    if _native is None:
        return {"built": False, "on": False, "why": _why_not, "kernel": "numpy"}
    on = bool(T.native)
    return {"built": True, "on": on, "kernel": "compiled" if on else "numpy",
            "why": "built and switched on" if on else f"switched off ({parallel.NATIVE_ENV}=0 or TUNING.native)",
            "cpu_level": _native.cpu_level(), "level": _native.level(), "entries": _native.entries(),
            "variants": _native.VARIANTS, "compiler": _native.COMPILER, "module": _native.__file__}


def summary() -> str:
    """info() in one line: which kernel runs, and why."""
    i = info()
    if not i["built"]:
        return f"kernel: NumPy (the compiled kernel is {i['why']})"
    if not i["on"]:
        return f"kernel: NumPy (the compiled kernel is {i['why']})"
    return (f"kernel: compiled, {i['entries']['dequantize']} variant (CPU level {i['cpu_level']}, running at "
            f"{i['level']}; {i['compiler'].split(' (')[0].strip()})")


def built() -> bool:
    """Whether the compiled kernel was built and loads."""
    return _native is not None


def handles(src_dtype: np.dtype, dst: np.dtype) -> bool:
    """Whether the compiled kernel was built and knows these dtypes (whether a call takes it
    also depends on TUNING.native, and on out being C-contiguous in native order)."""
    return _native is not None and src_dtype in _SRC and dst in _DST


def rtn_levels(g: np.ndarray, reciprocal: np.ndarray, zero: np.ndarray, qmax: int) -> np.ndarray | None:
    """uint8 levels of ONNX Runtime's MatMul RTN (dyndq/quantization/rtn.py, matmul_levels) for
    float32 groups `g` [..., group] and float32 `reciprocal` and `zero` [...] (one per group),
    in one compiled pass; None when the compiled kernel is not built or is switched off
    (TUNING.native), for the caller's NumPy path, which gives the same bytes."""
    if _native is None or not T.native:
        return None
    g = np.ascontiguousarray(g, np.float32)
    out = np.empty(g.shape, np.uint8)
    if g.size:
        _native.rtn_levels(g, np.ascontiguousarray(reciprocal, np.float32), np.ascontiguousarray(zero, np.float32),
                           out, g.shape[-1], int(qmax))
    return out


RTN_RULES = {"matmul": 0, "gather": 1}  # (kernels/_native_quantize.h, RULE_*)


def rtn_tile(w3: np.ndarray, levels3: np.ndarray, scales3: np.ndarray, zeros3: np.ndarray, group: int, qmax: int,
             symmetric: bool, rule: str, o: tuple, k: tuple, n: tuple) -> tuple | None:
    """ONNX Runtime's RTN by `rule` ("matmul" or "gather", dyndq/quantization/rtn.py) on the tile
    [o0, o1) x [k0, k1) x [n0, n1) of the C-contiguous float32 weight `w3` [outer, length, inner],
    quantized along its middle axis in groups of `group` (dyndq/quantization/numerics.py), in one
    compiled pass read in place: its levels written into `levels3` [outer, padded, inner]
    (uint8), its scales and zero levels into `scales3` (float32) and `zeros3` (uint8) [outer,
    padded / group, inner].  Returns (done, sq_error, sq_weight, sq_dequantized, dot, max_abs):
    done False where the caller's NumPy path must redo the tile (a value beyond float32's range,
    or a group of zeros with a -0 in it: kernels/_native_quantize.h, TileSums); None when the
    compiled kernel is not built or is switched off (TUNING.native)."""
    if _native is None or not T.native:
        return None
    _, length, inner = w3.shape
    return _native.rtn_tile(w3, levels3, scales3, zeros3, length, levels3.shape[1], inner, group, int(qmax),
                            bool(symmetric), RTN_RULES[rule], *o, *k, *n)


def dequantize(src, scales, zps, vshape, varies, out, threads=None, count_p=None):
    """Fill out (C-contiguous, native, T2) with the dequantization of src viewed as vshape,
    parameters varying along the dims flagged in `varies` (count_p of them, when the caller
    knows); arguments already judged valid.  (Lean on purpose: a tiny call's cost is this
    function's Python.)"""
    n = src.size
    if n == 0:
        return out
    head, kinds = c_args(src, scales, zps, vshape, varies, out, count_p)
    stream = out.nbytes >= T.stream_min
    if n < T.parallel_min:
        _native.dequantize(*head, 0, n, stream, *kinds)
        return out
    count = -(-n // T.chunk)
    n_threads = parallel.threads_for(n, count, threads)
    per = -(-count // n_threads) * T.chunk  # one contiguous range per thread: one C call each
    parallel.run(lambda a, b: _native.dequantize(*head, a * per, min(b * per, n), stream, *kinds),
                 n_threads, n_threads)
    return out


def c_args(src, scales, zps, vshape, varies, out, count_p=None):
    """The C call's arguments before (src ... zmode) and after (scale and zero-point kinds)
    its start, stop and stream: `_native.dequantize(*head, start, stop, stream, *kinds)`."""
    if count_p is None:
        count_p = param_count(vshape, varies)
    # Parameters that change at every element (varies[-1]) are widened here once to float32 and
    # int32 for the plain C loop; the fused loops (AVX2, AVX-512) read them as given, as every
    # level reads parameters that hold for a group: no widening pass before the threads.
    widen = varies[-1] and _native.level() < 1
    sc, sk = _params(scales, _SCALE_KIND, _F32, widen)  # exact: float16/bfloat16/e8m0 are float32 values
    if sc.size != count_p:  # one scale for many params (a per-channel axis of size 1 cannot be)
        sc = np.full(count_p, sc.reshape(()), sc.dtype)
    kind = _SRC[src.dtype]
    z, zmode, zk = (None, _ZMODE["none"], _ZP_KIND[_I32]) if zps is None else \
        _zero_points(zps, count_p, widen, src.dtype)
    head = (_bytes(src), _bytes(out), _bytes(sc), None if z is None else _bytes(z), vshape, varies,
            kind, _DST[out.dtype], zmode)
    return head, (sk, zk, _table(src.dtype) if kind == _TABLE_KIND else None)


def dequantize_one(src, scales, zps, out):
    """dequantize with one scale and one zero point (or none) for all of src, passed to C as
    Python numbers (a float holds any float32 exactly): the lean entry for small calls.  (Float
    codes' zero points, a float's sign, take the other entry.)"""
    kind = _SRC[src.dtype]
    if zps is not None and kind == _TABLE_KIND:
        return dequantize(src, scales, zps, (src.size,), (False,), out)
    _native.dequantize_one(_bytes(src), _bytes(out), float(scales.item()), None if zps is None else int(zps.item()),
                           kind, _DST[out.dtype], _table(src.dtype) if kind == _TABLE_KIND else None)
    return out


def _table(dtype: np.dtype) -> np.ndarray:
    """The decoding table of a one-byte float type (float8, float6, float4), built once per dtype:
    the float32 value of each byte as ml_dtypes decodes it (bytes with bits beyond the type's
    width included), then, where each of them is a float16 value too (it is, for every such type
    of ours), their float16 bits, which the vector loops look up instead (_native.c, table_ok);
    as bytes.  Checked exact: every value converts back to itself (a NaN to a NaN, and NaNs are
    quiet: a NaN code's product is its own NaN), and each float16 one widens to the very float32
    bits."""
    table = _TABLES.get(dtype)
    if table is None:
        t = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
        with np.errstate(all="ignore"):
            back = t.astype(dtype).astype(np.float32)
            h = t.astype(np.float16)
        nan = np.isnan(t)
        if not (np.array_equal(np.isnan(back), nan) and np.array_equal(back[~nan].view(np.uint32),
                                                                        t[~nan].view(np.uint32))
                and np.all(t.view(np.uint32)[nan] & 0x00400000)):  # (quiet: the C side gives them as they are)
            raise RuntimeError(f"{dtype.name}: ml_dtypes' float32 values of its codes are not exact")
        half = (np.array_equal(h.astype(np.float32).view(np.uint32), t.view(np.uint32))
                and bool(np.all(h.view(np.uint16)[nan] & 0x0200)))
        table = np.concatenate([t.view(np.uint8), h.view(np.uint8) if half else np.zeros(0, np.uint8)])
        table.flags.writeable = False  # (a fresh array: aligned, as the C side asks)
        _TABLES[dtype] = table
    return table


def _zero_points(zps, count_p, widen, src_dtype):
    """The zero points, one per parameter, as int32 (widen) or as given when the C loop reads
    their dtype; whether src - zp fits in int32 for every src of its dtype ("narrow") or needs
    the wide subtraction; and their kind for the C loop.  Float codes' zero points (zeros, of
    either sign) go as their float32 bits, subtracted in float32 ("float")."""
    if src_dtype not in _RANGE:  # (decoded by a table)
        z = np.ascontiguousarray(zps, dtype=_F32).reshape(-1).view(_I32)
        return (z if z.size == count_p else np.full(count_p, z[0], _I32)), _ZMODE["float"], _ZP_KIND[_I32]
    z, zk = _params(zps, _ZP_KIND, _I32, widen)  # exact: every zp dtype of ours fits in int32
    if z.size != count_p:
        z = np.full(count_p, z.reshape(()), z.dtype)  # one zp for every channel
    lo, hi = _RANGE[src_dtype]
    if z.size == 0 or (zps.dtype.itemsize <= 2 and src_dtype.itemsize <= 2):  # |src - zp| < 2**17
        narrow = True
    else:
        narrow = lo - int(z.max()) >= _I32_MIN and hi - int(z.min()) <= _I32_MAX
    return z, _ZMODE["narrow" if narrow else "wide"], zk


def _params(a: np.ndarray, kinds: dict, wide: np.dtype, widen: bool):
    """a as given when the C loop reads its dtype (kinds) and widen is off, else widened to
    `wide`; and its kind for the C loop."""
    kind = None if widen else kinds.get(a.dtype)  # (a non-native byte order is not among the keys)
    return (_widened(a, wide), kinds[wide]) if kind is None else (a, kind)


def _bytes(a: np.ndarray) -> np.ndarray:
    """a's C-contiguous buffer as the C side takes it: ml_dtypes arrays (int4, bfloat16, float8)
    export no buffer of their own, so 1- and 2-byte arrays go as uint8 / uint16 (a copy only for
    src of another layout; every other array comes contiguous already)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.view(_U16) if a.dtype.itemsize == 2 else a.view(_U8) if a.dtype.itemsize == 1 else a


_WIDEN_MIN = 1024  # fewer parameters: NumPy's cast, whose call costs less than ours


def _widened(a: np.ndarray, to: np.dtype) -> np.ndarray:
    """a as a C-contiguous array of `to` (float32 scales, int32 zero points), exactly."""
    if a.size < _WIDEN_MIN:
        return a if a.dtype is to and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=to)
    if a.dtype == to:
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    kind = _WIDEN.get(a.dtype)  # (a non-native byte order is not among the keys: NumPy's cast)
    if kind is None:
        return np.ascontiguousarray(a, dtype=to)
    out = np.empty(a.shape, to)
    _native.widen(_bytes(a), out, kind)
    return out


def cpu_level() -> int:
    """What this CPU lets the compiled kernel use: 0 plain C, 1 AVX2/F16C, 2 AVX-512."""
    return _native.cpu_level()


def level() -> int:
    """The level the compiled kernel runs at: cpu_level(), unless at_level lowered it."""
    return _native.level()


@contextlib.contextmanager
def at_level(n: int):
    """Run the compiled kernel at level n (0 to cpu_level()) inside the block: its table is
    filled with that level's variants, the very code a machine without AVX-512 (or without
    AVX2) runs.  (Process-wide: not for use while other threads dequantize.)"""
    before = _native.level()
    _native.set_level(n)
    try:
        yield
    finally:
        _native.set_level(before)


def narrow(p: np.ndarray, dst) -> np.ndarray:
    """float32 -> float16 / bfloat16, as the compiled kernel rounds at the level in force (for
    tests: at_level(0) gives the plain C rounding of machines without AVX2/F16C)."""
    p = np.ascontiguousarray(p, dtype=_F32)
    out = np.empty(p.shape, dst)
    _native.narrow(p, out.view(_U16), _DST[np.dtype(dst)])
    return out
