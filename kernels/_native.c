/* dyndq's optional compiled kernel: DynamicDequantize in one fused pass.

    out[e] = OT(float32(decode(src[e]) - decode(zp[p(e)])) * float32(decode(scale[p(e)])))

NumPy needs a pass per step (cast, subtract, multiply, and a dozen for a float16
rounding), where this makes one: it reads a byte of src and writes the output
once.  Nothing in NumPy, ml_dtypes or ONNX Runtime does that for our forms with
our bits (ORT's blocked int4 path is several times slower, and its float16 NaNs
differ by code path), hence this file.  It is optional: kernels/native.py falls
back to the NumPy kernels when it is not built, and the tests run both.

The caller (kernels/native.py) has done every check and conversion:
* src is C-contiguous: integer codes (int8, uint8; int4/uint4 and int2/uint2 one
  element a byte, the low bits, sign-extended for the signed ones, as ml_dtypes
  reads them; int16, uint16, int32), or one-byte float codes (float8, float6,
  float4) with the table of their 256 float32 values (_native_scalar.h, SRC_TAB);
* it is viewed as dims[0..k-1] (C order); params vary along the dims flagged in
  `varies` and broadcast along the others; scales (float32, float16, bfloat16 or
  float8_e8m0fnu) and zps (int32, or of 2 to 16 bits) are contiguous, of the
  varying dims' shape (widened to float32 / int32 where they change at every
  element and the CPU level is 0);
* zps is absent, or "narrow" (src - zp fits in int32 for every src of its dtype, so
  its conversion to float32 is the one rounding of the exact difference), or "wide"
  (the difference in double: exact, then rounded once), or, for float codes, "float"
  (zeros given as their float32 bits, subtracted in float32: a -0 code minus -0 is +0);
* out is C-contiguous float32, or float16 / bfloat16 bits: OT, whatever the
  scales' dtype.

Exactness: the integer difference is exact; its conversion to float32 rounds to
nearest even (the one rounding of the oracle); float codes and scales decode to
their exact float32 values; one float32 multiply, the difference first (a NaN
code times a NaN scale is the code's NaN, as x86 gives the first operand's: see
product in _native_scalar.h; no fused multiply-add: built with -ffp-contract=off);
then one rounding to OT, nearest
even, written out in integer steps below and checked against NumPy's and
ml_dtypes' casts over all 2**32 float32 patterns.  float16 NaNs are the one quiet
NaN 0x7E00 (kernels/narrowing.py says why); bfloat16 NaNs are ml_dtypes' (0x7FC0
with the sign).

Levels and the one dispatcher: each entry (dequantize, widen, narrow) is compiled once per
variant, each variant explicitly for its target (_native_variant.h, included three times):
"scalar" (level 0, plain C for the baseline ISA: what a CPU without AVX2, or of another
family, runs), "avx2" (level 1: AVX2 + F16C, with the staged writer emit and the fused
loops lanes256 / table256 / runs256) and "avx512" (level 2: AVX-512 F/BW/VL, emit512,
lanes512 / table512 / runs512).  One table (K, below) holds the entry each call takes: filled with the scalar
variants first, overridden per level in one place (choose), at import from the CPU's level
(kernels/native.py lowers it for DYNDQ_CPU_LEVEL), and by set_level for tests; entries()
tells which variant each entry runs.  Built with DYNDQ_NO_SIMD (or on a CPU family other
than x86-64) only the scalar variant exists.

Files: this one (the table, the Python entry points); _native_port.h (all that is
particular to a compiler or a CPU family); _native_scalar.h (the kinds, the arithmetic
element by element, the plain loop); _native_variant.h (an entry's body, per variant);
_native_x86.h (vector conversions, non-temporal stores, emit / emit512); _native_fused.h
(the fused loops); _native_quantize.h (quantize's rtn, not the op: the levels, a tile in place).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_native_scalar.h" /* the kinds, the arithmetic element by element, the plain loop */
#include "_native_quantize.h" /* quantize's rtn: the levels, and a whole tile in place */

/* The staged writer (emit) converts the plain loop's float32 products STAGE at a time, in a
   block that stays in L1; the plain loop's parameters are widened STAGE at a time too. */
#define STAGE 2048

typedef struct {
    const uint8_t *src;
    const float *tab;      /* SRC_TAB's 256 values (NULL for other kinds) */
    const uint16_t *tab16; /* the same as float16 bits, where the caller found each exact (else NULL) */
    char *out;
    const char *scales, *zps;
    int sk, zk; /* their kinds (SK_*, ZK_*) */
    int k, src_kind, dst_kind, zmode, out_size;
    Py_ssize_t g; /* params change every g columns of a row (see seg) */
    int stream;   /* non-temporal stores (see emit) */
    Py_ssize_t dims[MAX_DIMS], pstride[MAX_DIMS];
} Job;

/* A row of params widened once for the fused loops (_native_variant.h, run_range). */
#define ROW_CACHE 65536
typedef struct {
    float *sbuf; /* where the kinds that need it are widened (NULL: none needs it) */
    int32_t *zbuf;
    const float *sc; /* the row's params, widened or as given */
    const int32_t *zp;
    Py_ssize_t poff; /* whose params they are; -1: none yet */
    int on;          /* 0: not used (not wanted, or no memory): params are read as given */
} RowCache;

#ifdef DQ_X86
#include "_native_x86.h"   /* AVX2 / AVX-512: conversions, non-temporal stores, emit and emit512 */
#include "_native_fused.h" /* the fused loops: lanes and table, AVX-512 and AVX2 */
#endif

/* The variants, each compiled for its own target. */
#define VARIANT scalar
#define VARIANT_LEVEL 0
#define VARIANT_TARGET
#include "_native_variant.h"
#undef VARIANT
#undef VARIANT_LEVEL
#undef VARIANT_TARGET
#ifdef DQ_X86
#define VARIANT avx2
#define VARIANT_LEVEL 1
#define VARIANT_TARGET DQ_AVX2
#include "_native_variant.h"
#undef VARIANT
#undef VARIANT_LEVEL
#undef VARIANT_TARGET
#define VARIANT avx512
#define VARIANT_LEVEL 2
#define VARIANT_TARGET DQ_AVX512
#include "_native_variant.h"
#undef VARIANT
#undef VARIANT_LEVEL
#undef VARIANT_TARGET
#endif

/* The one table of entries: what each call runs, and the name of its variant. */
typedef void (*run_fn)(const Job *, Py_ssize_t, Py_ssize_t);
typedef void (*widen_fn)(const void *, void *, Py_ssize_t, int);
typedef void (*narrow_fn)(const float *, uint16_t *, Py_ssize_t, int);
static struct {
    int level;
    struct { const char *variant; run_fn fn; } dequantize;
    struct { const char *variant; widen_fn fn; } widen;
    struct { const char *variant; narrow_fn fn; } narrow;
} K;
static int cpu_level = 0;

/* Fill the table for a level (0 to cpu_level): the portable entries first, then each level's
   own over them, in this one place. */
static void choose(int level) {
    K.level = level;
    K.dequantize.variant = K.widen.variant = K.narrow.variant = "scalar";
    K.dequantize.fn = run_range_scalar;
    K.widen.fn = widen_range_scalar;
    K.narrow.fn = narrow_range_scalar;
#ifdef DQ_X86
    if (level >= 1) {
        K.dequantize.variant = K.widen.variant = K.narrow.variant = "avx2";
        K.dequantize.fn = run_range_avx2;
        K.widen.fn = widen_range_avx2;
        K.narrow.fn = narrow_range_avx2;
    }
    if (level >= 2) {
        K.dequantize.variant = K.widen.variant = K.narrow.variant = "avx512";
        K.dequantize.fn = run_range_avx512;
        K.widen.fn = widen_range_avx512;
        K.narrow.fn = narrow_range_avx512;
    }
#endif
}

/* *out = a * b for sizes a, b >= 0; 0 (and a ValueError set) when it overflows Py_ssize_t. */
static int size_mul(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out, const char *what) {
    if (a != 0 && b > PY_SSIZE_T_MAX / a) {
        PyErr_Format(PyExc_ValueError, "%s: the size overflows", what);
        return 0;
    }
    *out = a * b;
    return 1;
}

/* Whether the job's kinds are ones this file knows (else a ValueError is set). */
static int kinds_ok(const Job *J) {
    if (J->src_kind < SRC_I8 || J->src_kind > SRC_TAB || J->dst_kind < DST_F32 || J->dst_kind > DST_BF16 ||
        J->zmode < ZP_NONE || J->zmode > ZP_FLOAT || J->sk < SK_F32 || J->sk > SK_E8M0 || J->zk < ZK_I32 ||
        J->zk > ZK_U16) {
        PyErr_SetString(PyExc_ValueError, "unknown src, dst, scale or zero-point kind");
        return 0;
    }
    return 1;
}

/* The decoding table of SRC_TAB (whose codes take zero points "float" or none), none for the other kinds:
   256 float32, the value of each byte, optionally followed by the same 256 values as float16
   bits where each is exactly its float32 value (NaNs quiet; kernels/native.py checks), which the
   vector loops look up instead (runs512: two-register word permutes, a quarter of a gather's
   cost).  0 (and a ValueError set) when the buffer does not fit the kind. */
static int table_ok(Job *J, Py_buffer *t) {
    if ((J->src_kind == SRC_TAB) != (t->buf != NULL)) {
        PyErr_SetString(PyExc_ValueError, "a table is given for src of kind table, and for no other");
        return 0;
    }
    if ((J->zmode == ZP_FLOAT) && (!t->buf || J->zk != ZK_I32)) {
        PyErr_SetString(PyExc_ValueError, "float zero points go with src decoded by a table, as int32 bits");
        return 0;
    }
    if (!t->buf) return 1;
    if ((t->len != 256 * 4 && t->len != 256 * 6) || (uintptr_t)t->buf % 4) {
        PyErr_SetString(PyExc_ValueError, "the table: 256 float32 (then 256 float16), aligned");
        return 0;
    }
    if (J->zmode != ZP_NONE && J->zmode != ZP_FLOAT) {
        PyErr_SetString(PyExc_ValueError, "src decoded by a table takes float zero points or none");
        return 0;
    }
    J->tab = t->buf;
    J->tab16 = t->len == 256 * 6 ? (const uint16_t *)(J->tab + 256) : NULL;
    return 1;
}

static int buffer_ok(Py_buffer *b, Py_ssize_t need, const char *what) {
    if (b->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", what, b->len, need);
        return 0;
    }
    return 1;
}

/* Outputs are written through typed pointers: they must be aligned to their element size. */
static int aligned_ok(const void *p, int size, const char *what) {
    if ((uintptr_t)p % (uintptr_t)size == 0) return 1;
    PyErr_Format(PyExc_ValueError, "%s is not aligned to its element size (%d bytes)", what, size);
    return 0;
}

/* dequantize(src, out, scales, zps, dims, varies, src_kind, dst_kind, zmode, start, stop, stream,
              scale_kind, zp_kind[, table]) */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    Py_buffer s = {0}, o = {0}, sc = {0}, z = {0}, t = {0};
    PyObject *zobj, *dims, *varies, *tobj = Py_None;
    Job J;
    Py_ssize_t start, stop;
    PyObject *result = NULL;
    (void)self;
    memset(&J, 0, sizeof J);
    if (!PyArg_ParseTuple(args, "y*w*y*OO!O!iiinnpii|O", &s, &o, &sc, &zobj, &PyTuple_Type, &dims, &PyTuple_Type,
                          &varies, &J.src_kind, &J.dst_kind, &J.zmode, &start, &stop, &J.stream, &J.sk, &J.zk,
                          &tobj))
        return NULL;
    if (zobj != Py_None && PyObject_GetBuffer(zobj, &z, PyBUF_SIMPLE) < 0)
        goto done;
    if (tobj != Py_None && PyObject_GetBuffer(tobj, &t, PyBUF_SIMPLE) < 0)
        goto done;
    J.k = (int)PyTuple_GET_SIZE(dims);
    if (J.k < 1 || J.k > MAX_DIMS || PyTuple_GET_SIZE(varies) != J.k) {
        PyErr_SetString(PyExc_ValueError, "dims and varies: 1 to 32 of each, as many of one as the other");
        goto done;
    }
    if (!kinds_ok(&J) || !table_ok(&J, &t))
        goto done;
    if ((J.zmode == ZP_NONE) != (zobj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "zmode says no zero points, or zps are missing");
        goto done;
    }
    Py_ssize_t n = 1, np_ = 1, out_bytes, sc_bytes, zp_bytes;
    for (int d = J.k - 1; d >= 0; d--) {
        J.dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(dims, d));
        int v = PyObject_IsTrue(PyTuple_GET_ITEM(varies, d));
        if (PyErr_Occurred() || v < 0) goto done;
        if (J.dims[d] < 1) {
            PyErr_SetString(PyExc_ValueError, "dims must be positive");
            goto done;
        }
        J.pstride[d] = v ? np_ : 0;
        if (!size_mul(n, J.dims[d], &n, "dims") || (v && !size_mul(np_, J.dims[d], &np_, "dims")))
            goto done;
    }
    J.out_size = J.dst_kind == DST_F32 ? 4 : 2;
    /* the row: the last dim, or the last two when params vary along the one but not the
       other (groups along the last dim: a row of whole groups, fewer and longer rows) */
    if (J.pstride[J.k - 1] != 0) {
        J.g = 1;
    } else if (J.k >= 2 && J.pstride[J.k - 2] != 0) {
        J.g = J.dims[J.k - 1];
        J.dims[J.k - 2] *= J.dims[J.k - 1]; /* within n: no overflow */
        J.k--;
    } else {
        J.g = J.dims[J.k - 1] + 1; /* more than a row: the params never change along one */
    }
    Py_ssize_t src_bytes;
    if (!size_mul(n, J.out_size, &out_bytes, "out") || !size_mul(np_, SCALE_SIZE[J.sk], &sc_bytes, "scales") ||
        !size_mul(np_, ZP_SIZE[J.zk], &zp_bytes, "zps") || !size_mul(n, SRC_SIZE[J.src_kind], &src_bytes, "src"))
        goto done;
    if (!buffer_ok(&s, src_bytes, "src") || !buffer_ok(&o, out_bytes, "out") || !buffer_ok(&sc, sc_bytes, "scales") ||
        (z.buf && !buffer_ok(&z, zp_bytes, "zps")) || !aligned_ok(o.buf, J.out_size, "out"))
        goto done;
    if (start < 0 || stop > n || start > stop) {
        PyErr_SetString(PyExc_ValueError, "start and stop must lie within the view");
        goto done;
    }
    J.src = s.buf;
    J.out = o.buf;
    J.scales = sc.buf;
    J.zps = z.buf; /* (J.sk, J.zk: as parsed) */
    if (stop > start) {
        const run_fn run = K.dequantize.fn;
        Py_BEGIN_ALLOW_THREADS
        run(&J, start, stop);
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    PyBuffer_Release(&sc);
    if (z.buf) PyBuffer_Release(&z);
    if (t.buf) PyBuffer_Release(&t);
    return result;
}

/* The smallest and the largest value of each integer src kind (SRC_TAB: none) */
static const long long SRC_MIN[] = {-128, 0, -8, 0, -2, 0, INT16_MIN, 0, INT32_MIN, 0},
                       SRC_MAX[] = {127, 255, 7, 15, 1, 3, INT16_MAX, UINT16_MAX, INT32_MAX, 0};

/* dequantize_one(src, out, scale, zp, src_kind, dst_kind[, table]): one scale (a Python float,
   which holds any float32 exactly) and one zero point (a Python int, or None) for the whole of
   src.  A tiny call's cost is its overhead; this entry skips the parameter arrays. */
static PyObject *py_dequantize_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "dequantize_one takes 6 or 7 arguments");
        return NULL;
    }
    Py_buffer s = {0}, o = {0}, t = {0};
    Job J;
    memset(&J, 0, sizeof J);
    float scale = (float)PyFloat_AsDouble(args[2]);
    long long zp = args[3] == Py_None ? 0 : PyLong_AsLongLong(args[3]);
    J.src_kind = (int)PyLong_AsLong(args[4]);
    J.dst_kind = (int)PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (!kinds_ok(&J))
        return NULL;
    if (zp < INT32_MIN || zp > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a zero point beyond int32");
        return NULL;
    }
    /* narrow when src - zp fits in int32 for every src of the kind */
    J.zmode = args[3] == Py_None ? ZP_NONE
              : SRC_MIN[J.src_kind] - zp >= INT32_MIN && SRC_MAX[J.src_kind] - zp <= INT32_MAX ? ZP_NARROW : ZP_WIDE;
    if (nargs == 7 && args[6] != Py_None && PyObject_GetBuffer(args[6], &t, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    if (!table_ok(&J, &t))
        goto done;
    if (PyObject_GetBuffer(args[0], &s, PyBUF_SIMPLE) < 0)
        goto done;
    if (PyObject_GetBuffer(args[1], &o, PyBUF_WRITABLE) < 0)
        goto done;
    J.out_size = J.dst_kind == DST_F32 ? 4 : 2;
    Py_ssize_t n = s.len / SRC_SIZE[J.src_kind], out_bytes;
    if (!size_mul(n, J.out_size, &out_bytes, "out") || !buffer_ok(&o, out_bytes, "out") ||
        !aligned_ok(o.buf, J.out_size, "out"))
        goto done;
    int32_t z = (int32_t)zp;
    J.k = 1;
    J.dims[0] = n > 0 ? n : 1;
    J.g = J.dims[0] + 1;
    J.src = s.buf;
    J.out = o.buf;
    J.scales = (const char *)&scale;
    J.zps = args[3] == Py_None ? NULL : (const char *)&z;
    const run_fn run = K.dequantize.fn;
    if (n > 4096) { /* (below, the GIL's round trip would cost more than the loop) */
        Py_BEGIN_ALLOW_THREADS
        run(&J, 0, n);
        Py_END_ALLOW_THREADS
    } else if (n > 0) {
        run(&J, 0, n);
    }
    result = Py_NewRef(Py_None);
done:
    if (s.buf) PyBuffer_Release(&s);
    if (o.buf) PyBuffer_Release(&o);
    if (t.buf) PyBuffer_Release(&t);
    return result;
}

/* widen(in_bytes, out, kind): float16 / bfloat16 scales to float32, 4- and 8-bit zero points to
   int32, as NumPy's and ml_dtypes' casts do, bit for bit.  NumPy's float16 cast and ml_dtypes'
   int4 cast cost more than the whole dequantization of a large per_group tensor (its
   parameters are a 32nd of it), hence this entry. */
static PyObject *py_widen(PyObject *self, PyObject *args) {
    Py_buffer in = {0}, out = {0};
    int kind;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*i", &in, &out, &kind))
        return NULL;
    PyObject *result = NULL;
    const int known = kind >= W_F16 && kind <= W_U16;
    Py_ssize_t n = known ? in.len / W_SIZE[kind] : 0;
    if (!known || out.len / 4 < n) {
        PyErr_SetString(PyExc_ValueError, "unknown kind, or out smaller than 4 bytes an element");
    } else if (aligned_ok(out.buf, 4, "out")) {
        const widen_fn widen = K.widen.fn;
        Py_BEGIN_ALLOW_THREADS
        widen(in.buf, out.buf, n, kind);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return result;
}

/* narrow(f32_bytes, out_bytes, dst_kind): float32 -> float16 / bfloat16 bits, rounded as the
   kernel's loops round at the level in force (for the tests of the roundings). */
static PyObject *py_narrow(PyObject *self, PyObject *args) {
    Py_buffer p = {0}, o = {0};
    int dst;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*i", &p, &o, &dst))
        return NULL;
    Py_ssize_t n = p.len / 4;
    PyObject *result = NULL;
    if ((dst != DST_F16 && dst != DST_BF16) || o.len / 2 < n) {
        PyErr_SetString(PyExc_ValueError, "dst_kind must be float16 or bfloat16, out 2 bytes an element");
    } else if (aligned_ok(p.buf, 4, "the float32 input") && aligned_ok(o.buf, 2, "out")) {
        const narrow_fn narrow = K.narrow.fn;
        Py_BEGIN_ALLOW_THREADS
        narrow(p.buf, o.buf, n, dst);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&p);
    PyBuffer_Release(&o);
    return result;
}

/* rtn_levels(g, reciprocal, zero, out, group, qmax): the levels of ONNX Runtime's MatMul RTN
   (dyndq/quantization/rtn.py, matmul_levels, whose NumPy path gives the same bytes) in one
   pass (_native_quantize.h); g, reciprocal and zero are float32, out uint8. */
static PyObject *py_rtn_levels(PyObject *self, PyObject *args) {
    Py_buffer g = {0}, r = {0}, z = {0}, o = {0};
    Py_ssize_t group;
    int qmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*w*ni", &g, &r, &z, &o, &group, &qmax))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t n = g.len / 4, groups = group > 0 ? n / group : 0;
    if (group <= 0 || qmax < 1 || qmax > 255 || g.len % 4 || n % group || r.len != groups * 4 ||
        z.len != groups * 4 || o.len != n) {
        PyErr_SetString(PyExc_ValueError, "rtn_levels: g float32 of whole groups, reciprocal and zero a float32 "
                                          "each per group, out a byte per element, qmax in [1, 255]");
    } else if (aligned_ok(g.buf, 4, "g") && aligned_ok(r.buf, 4, "reciprocal") && aligned_ok(z.buf, 4, "zero")) {
        const float fq = (float)qmax;
        Py_BEGIN_ALLOW_THREADS
        rtn_levels_loop(g.buf, r.buf, z.buf, o.buf, groups, group, fq);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&g);
    PyBuffer_Release(&r);
    PyBuffer_Release(&z);
    PyBuffer_Release(&o);
    return result;
}

/* rtn_tile(w, levels, scales, zeros, length, padded, inner, group, qmax, symmetric, rule,
            o0, o1, k0, k1, n0, n1) -> (done, sq_error, sq_weight, sq_dequantized, dot, max_abs):
   ONNX Runtime's RTN (rule 0 matmul, 1 gather) on a tile of a float32 weight [outer, length,
   inner], in place (_native_quantize.h, rtn_tile; dyndq/quantization/numerics.py calls it per
   block). */
static PyObject *py_rtn_tile(PyObject *self, PyObject *args) {
    Py_buffer w = {0}, l = {0}, s = {0}, z = {0};
    Py_ssize_t length, padded, inner, group, o0, o1, k0, k1, n0, n1;
    int qmax, symmetric, rule;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*w*w*nnnnipinnnnnn", &w, &l, &s, &z, &length, &padded, &inner, &group, &qmax,
                          &symmetric, &rule, &o0, &o1, &k0, &k1, &n0, &n1))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t row = length * inner, outer = row > 0 ? w.len / 4 / row : 0;
    const Py_ssize_t n_groups = group > 0 ? padded / group : 0;
    if (length <= 0 || inner <= 0 || group <= 0 || padded % group || padded < length || padded - length >= group ||
        qmax < 1 || qmax > 255 || (rule != RULE_MATMUL && rule != RULE_GATHER) || w.len != outer * row * 4 ||
        l.len != outer * padded * inner || s.len != outer * n_groups * inner * 4 || z.len != outer * n_groups * inner || o0 < 0 || o1 > outer ||
        o0 > o1 || k0 < 0 || k0 % group || k1 > length || k0 > k1 || (k1 % group && k1 != length) || n0 < 0 ||
        n1 > inner || n0 > n1) {
        PyErr_SetString(PyExc_ValueError, "rtn_tile: w float32 [outer, length, inner], levels uint8 [outer, padded, "
                                          "inner], scales float32 and zeros uint8 [outer, padded / group, inner], "
                                          "the tile within them, whole groups along length, qmax in [1, 255], "
                                          "rule 0 (matmul) or 1 (gather)");
    } else if (aligned_ok(w.buf, 4, "w") && aligned_ok(s.buf, 4, "scales")) {
        TileSums t;
        Py_BEGIN_ALLOW_THREADS
        t = rtn_tile(w.buf, l.buf, s.buf, z.buf, length, padded, inner, group, (float)qmax, symmetric, rule, o0, o1, k0,
                     k1, n0, n1);
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("(Oddddd)", t.done ? Py_True : Py_False, t.sq_error, t.sq_weight, t.sq_dequantized,
                               t.dot, t.max_abs);
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&l);
    PyBuffer_Release(&s);
    PyBuffer_Release(&z);
    return result;
}

static PyObject *py_cpu_level(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(cpu_level);
}

static PyObject *py_level(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(K.level);
}

/* entries(): {entry: the name of the variant it runs}, read from the table itself */
static PyObject *py_entries(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("{s:s,s:s,s:s}", "dequantize", K.dequantize.variant, "widen", K.widen.variant, "narrow",
                         K.narrow.variant);
}

/* set_level(n): fill the table for level n (0 to cpu_level) from now on */
static PyObject *py_set_level(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > cpu_level) {
        PyErr_Format(PyExc_ValueError, "level %ld: this CPU has levels 0 to %d", n, cpu_level);
        return NULL;
    }
    choose((int)n);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"dequantize", py_dequantize, METH_VARARGS, "Elements [start, stop) of a dequantization (see kernels/native.py)."},
    {"dequantize_one", (PyCFunction)(void (*)(void))py_dequantize_one, METH_FASTCALL,
     "src, out, scale, zp, src_kind, dst_kind: one scale and zero point for all of src (see kernels/native.py)."},
    {"widen", py_widen, METH_VARARGS, "float16/bfloat16 -> float32, int8/uint8/int4/uint4 -> int32 (KINDS['widen'])."},
    {"narrow", py_narrow, METH_VARARGS, "float32 -> float16 or bfloat16 bits, as the kernel rounds at its level."},
    {"rtn_levels", py_rtn_levels, METH_VARARGS, "ONNX Runtime's MatMul RTN levels (dyndq/quantization/rtn.py)."},
    {"rtn_tile", py_rtn_tile, METH_VARARGS,
     "ONNX Runtime's RTN (matmul or gather rule) on a tile of a float32 weight, in place."},
    {"cpu_level", py_cpu_level, METH_NOARGS, "The CPU's level: 0 plain C, 1 AVX2/F16C, 2 AVX-512."},
    {"level", py_level, METH_NOARGS, "The level the table is filled for (cpu_level unless set_level lowered it)."},
    {"entries", py_entries, METH_NOARGS, "Each entry's variant in the table: {'dequantize': 'avx512', ...}."},
    {"set_level", py_set_level, METH_O, "Fill the table for a level from 0 to cpu_level."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* KINDS: the codes of _native_scalar.h's enums by dtype name, the one definition Python reads
   (the float codes all decode through a table: "src" gives them SRC_TAB, "table" says which
   kind that is) */
static PyObject *kinds(void) {
    return Py_BuildValue(
        "{s:{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i},s:i,s:{s:i,s:i,s:i},"
        "s:{s:i,s:i,s:i,s:i},s:{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i},s:{s:i,s:i,s:i,s:i},"
        "s:{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}}",
        "src", "int8", SRC_I8, "uint8", SRC_U8, "int4", SRC_I4, "uint4", SRC_U4, "int2", SRC_I2, "uint2", SRC_U2,
        "int16", SRC_I16, "uint16", SRC_U16, "int32", SRC_I32, "float8_e4m3fn", SRC_TAB, "float8_e4m3fnuz", SRC_TAB,
        "float8_e5m2", SRC_TAB, "float8_e5m2fnuz", SRC_TAB, "float4_e2m1fn", SRC_TAB, "float6_e2m3fn", SRC_TAB,
        "float6_e3m2fn", SRC_TAB,
        "table", SRC_TAB,
        "dst", "float32", DST_F32, "float16", DST_F16, "bfloat16", DST_BF16,
        "scale", "float32", SK_F32, "float16", SK_F16, "bfloat16", SK_BF16, "float8_e8m0fnu", SK_E8M0,
        "zp", "int32", ZK_I32, "int8", ZK_I8, "uint8", ZK_U8, "int4", ZK_I4, "uint4", ZK_U4, "int2", ZK_I2,
        "uint2", ZK_U2, "int16", ZK_I16, "uint16", ZK_U16,
        "zmode", "none", ZP_NONE, "narrow", ZP_NARROW, "wide", ZP_WIDE, "float", ZP_FLOAT,
        "widen", "float16", W_F16, "bfloat16", W_BF16, "float8_e8m0fnu", W_E8M0, "int8", W_I8, "uint8", W_U8,
        "int4", W_I4, "uint4", W_U4, "int2", W_I2, "uint2", W_U2, "int16", W_I16, "uint16", W_U16);
}

PyMODINIT_FUNC PyInit__native(void) {
    cpu_level = dq_cpu_level();
    choose(cpu_level);
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifdef DQ_X86
    PyObject *built = Py_BuildValue("(sss)", "scalar", "avx2", "avx512");
#else
    PyObject *built = Py_BuildValue("(s)", "scalar");
#endif
    PyObject *codes = kinds(), *narrow_zp = PyLong_FromLongLong(NARROW_ZP);
    const int ok = built && codes && narrow_zp && PyModule_AddObjectRef(m, "KINDS", codes) == 0 &&
                   PyModule_AddObjectRef(m, "VARIANTS", built) == 0 &&
                   PyModule_AddObjectRef(m, "NARROW_ZP", narrow_zp) == 0 &&
                   PyModule_AddStringConstant(m, "COMPILER", DQ_COMPILER) == 0;
    Py_XDECREF(built);
    Py_XDECREF(codes);
    Py_XDECREF(narrow_zp);
    if (!ok) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
