/* dyndq's optional compiled kernel: DynamicDequantize in one fused pass.

    out[e] = T2(float32(int64(src[e]) - int64(zp[p(e)])) * scale[p(e)])

NumPy needs a pass per step (cast, subtract, multiply, and a dozen for a float16
rounding), where this makes one: it reads a byte of src and writes the output
once.  Nothing in NumPy, ml_dtypes or ONNX Runtime does that for our forms with
our bits (ORT's blocked int4 path is several times slower, and its float16 NaNs
differ by code path), hence this file.  It is optional: kernels/native.py falls
back to the NumPy kernels when it is not built, and the tests run both.

The caller (kernels/native.py) has done every check and conversion:
* src is C-contiguous bytes: int8, uint8, or int4/uint4 one element a byte (the
  low nibble, sign-extended for int4, as ml_dtypes reads it);
* it is viewed as dims[0..k-1] (C order); params vary along the dims flagged in
  `varies` and broadcast along the others; scales (float32, float16 or bfloat16)
  and zps (int32 or 4/8-bit) are contiguous, of the varying dims' shape (widened
  to float32 / int32 where they change at every element and the CPU level is 0);
* zps is absent, or "narrow" (src - zp fits in int32, so its conversion to
  float32 is the one rounding of the exact difference), or "wide" (subtract in
  int64);
* out is C-contiguous float32, or float16 / bfloat16 bits.

Exactness: the integer difference is exact; its conversion to float32 rounds to
nearest even (the one rounding of the oracle); one float32 multiply (no fused
multiply-add: built with -ffp-contract=off); then one rounding to T2, nearest
even, written out in integer steps below and checked against NumPy's and
ml_dtypes' casts over all 2**32 float32 patterns.  float16 NaNs are the one quiet
NaN 0x7E00 (kernels/narrowing.py says why); bfloat16 NaNs are ml_dtypes' (0x7FC0
with the sign).

Levels: what the CPU lets us use (cpu_level), and what the kernel runs at (level,
lowered by set_level for tests): 0 the plain loop of _native_scalar.h, built per
x86-64 level by GCC; 1 adds AVX2 and F16C: the staged loop's writer emit and the
fused loops lanes256 / table256; 2 adds AVX-512: emit512, lanes512 / table512.
run_range (below) chooses among them for each row.

Files: this one (levels, run_range, the Python entry points); _native_scalar.h (the
arithmetic element by element, the plain loop); _native_x86.h (vector conversions,
non-temporal stores, emit / emit512); _native_fused.h (the fused loops).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_native_scalar.h" /* the arithmetic element by element, the plain loop: every level */

/* Writing the output of the plain loop, where the CPU has AVX2 and F16C (or AVX-512): the
   products are staged as float32 in a block that stays in L1, then converted 8 (16) at a
   time and stored.  float16 goes through the CPU's own conversion (nearest even), a NaN (bits
   above 0x7C00 once the sign is off) made 0x7E00; bfloat16 through the same integer
   rounding as to_bf16.  With `stream`, stores bypass the cache (non-temporal): a large
   output is then written without first being read into the cache, which is most of
   what memory costs (oneDNN's reorders write so too); small outputs are kept in cache
   for whatever reads them next. */
typedef void (*emit_fn)(const float *f, char *o, Py_ssize_t n, int dst, int stream);
static emit_fn emit_best = NULL; /* NULL: no vector emit; the plain loop writes the output */
#define STAGE 2048

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "_native_x86.h"   /* AVX2 / AVX-512: conversions, non-temporal stores, emit and emit512 */
#include "_native_fused.h" /* the fused loops: lanes and table, AVX-512 and AVX2 */

static void fence(void) { _mm_sfence(); } /* non-temporal stores made visible before we return */

/* the widest emit the CPU has (AVX-512, AVX2 + F16C), and what each level may use */
static int cpu_level = 0;
static int level = 0; /* the level the kernel runs at: cpu_level, or lower for a test (set_level) */
static void detect_cpu(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        cpu_level = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            cpu_level = 2;
    }
}
static emit_fn emit_for(int at) { return at >= 2 ? emit512 : at == 1 ? emit : NULL; }
#else
static int cpu_level = 0;
static int level = 0;
static void fence(void) {}
static void detect_cpu(void) {}
static emit_fn emit_for(int at) { return NULL; }
#endif

CLONES static void widen_range(const void *in, void *out, Py_ssize_t n, int kind) {
    const uint16_t *h = in;
    const uint8_t *b = in;
    uint32_t *f = out;
    int32_t *z = out;
    switch (kind) {
    case W_F16: for (Py_ssize_t i = 0; i < n; i++) f[i] = f16_to_f32_bits(h[i]); break;
    case W_BF16: for (Py_ssize_t i = 0; i < n; i++) f[i] = (uint32_t)h[i] << 16; break;
    case W_I8: for (Py_ssize_t i = 0; i < n; i++) z[i] = load(b, i, SRC_I8); break;
    case W_U8: for (Py_ssize_t i = 0; i < n; i++) z[i] = load(b, i, SRC_U8); break;
    case W_I4: for (Py_ssize_t i = 0; i < n; i++) z[i] = load(b, i, SRC_I4); break;
    default: for (Py_ssize_t i = 0; i < n; i++) z[i] = load(b, i, SRC_U4); break;
    }
}

typedef struct {
    const uint8_t *src;
    char *out;
    const char *scales, *zps;
    int sk, zk; /* their kinds (SK_*, ZK_*) */
    int k, src_kind, dst_kind, zmode, out_size;
    Py_ssize_t g; /* params change every g columns of a row (see seg) */
    int stream;   /* non-temporal stores (see emit) */
    Py_ssize_t dims[MAX_DIMS], pstride[MAX_DIMS];
} Job;

/* Params [p0, p0 + count) of a row as float32 / int32 in *sc / *zp: the row itself where it
   holds them so, else widened into sbuf / zbuf (zbuf unused without zero points). */
static inline void widened(const Job *J, const char *sc_row, const char *zp_row, Py_ssize_t p0, Py_ssize_t count,
                           float *sbuf, int32_t *zbuf, const float **sc, const int32_t **zp) {
    if (J->sk == SK_F32) *sc = (const float *)sc_row + p0;
    else { widen_range(sc_row + p0 * SCALE_SIZE[J->sk], sbuf, count, SCALE_WIDEN[J->sk]); *sc = sbuf; }
    if (!zp_row) *zp = NULL;
    else if (J->zk == ZK_I32) *zp = (const int32_t *)zp_row + p0;
    else { widen_range(zp_row + p0 * ZP_SIZE[J->zk], zbuf, count, ZP_WIDEN[J->zk]); *zp = zbuf; }
}

#ifdef HAVE_FUSED
/* A row of params as float32 / int32 (see run_range), for the row at poff. */
#define ROW_CACHE 65536
typedef struct {
    float *sbuf; /* where the kinds that need it are widened (NULL: none needs it) */
    int32_t *zbuf;
    const float *sc; /* the row's params, widened or as given */
    const int32_t *zp;
    Py_ssize_t poff; /* whose params they are; -1: none yet */
    int on;          /* 0: not used (not wanted, or no memory): params are read as given */
} RowCache;

static void row_cache_open(RowCache *rc, const Job *J, Py_ssize_t L) {
    const int wide_sc = J->sk != SK_F32, wide_zp = J->zps && J->zk != ZK_I32;
    rc->sbuf = wide_sc ? malloc(L * sizeof(float)) : NULL;
    rc->zbuf = wide_zp ? malloc(L * sizeof(int32_t)) : NULL;
    rc->on = (!wide_sc || rc->sbuf) && (!wide_zp || rc->zbuf);
}

static void row_cache_fill(RowCache *rc, const Job *J, const char *sc_row, const char *zp_row, Py_ssize_t L,
                           Py_ssize_t poff) {
    if (rc->poff == poff) return;
    widened(J, sc_row, zp_row, 0, L, rc->sbuf, rc->zbuf, &rc->sc, &rc->zp);
    rc->poff = poff;
}

static void row_cache_close(RowCache *rc) {
    free(rc->sbuf);
    free(rc->zbuf);
}
#endif

/* Elements [start, stop) of the view, row by row (a row: the innermost dim, or the two
   innermost when groups of g along the last dim vary along the one before), keeping
   the index and the params' offset as counters rather than dividing at every row. */

CLONES static void run_range(const Job *J, Py_ssize_t start, Py_ssize_t stop) {
    const int k = J->k;
    const Py_ssize_t L = J->dims[k - 1];
    Py_ssize_t idx[MAX_DIMS];
    Py_ssize_t r = start / L, col = start % L, poff = 0;
    for (int d = k - 2; d >= 0; d--) {
        idx[d] = r % J->dims[d];
        r /= J->dims[d];
        poff += idx[d] * J->pstride[d];
    }
    const Py_ssize_t g = J->g;
    const int narrow_params = J->sk != SK_F32 || (J->zps && J->zk != ZK_I32); /* to widen here */
    const int staged = emit_best && (J->stream || J->dst_kind == DST_F16);
#ifdef HAVE_FUSED
    /* the fused loops: lanes512 / table512 with AVX-512, lanes256 / table256 (16-bit outputs)
       with AVX2 and F16C */
    const int fused = level >= 1 && J->zmode != ZP_WIDE;
    const int tables = fused && g >= 16 && (J->src_kind == SRC_I4 || J->src_kind == SRC_U4) &&
                       (level >= 2 || J->dst_kind != DST_F32);
    /* Rows that share their params (groups along an outer axis; per channel on the last):
       lanes reads them widened from a row widened once per change of params, since decoding
       them at every element costs a quarter of its work.  Other rows, and rows longer than
       ROW_CACHE, it reads as given. */
    RowCache rc = {NULL, NULL, NULL, NULL, -1, 0};
    if (fused && g == 1 && narrow_params && k >= 2 && J->pstride[k - 2] == 0 && L <= ROW_CACHE)
        row_cache_open(&rc, J, L);
#endif
    Py_ssize_t e = start;
    while (e < stop) {
        Py_ssize_t n = L - col < stop - e ? L - col : stop - e;
        const char *sc_row = J->scales + poff * SCALE_SIZE[J->sk];
        const char *zp_row = J->zps ? J->zps + poff * ZP_SIZE[J->zk] : NULL;
#ifdef HAVE_FUSED
        if (fused && g == 1) {
            int sk = J->sk, zk = J->zk;
            if (rc.on) {
                row_cache_fill(&rc, J, sc_row, zp_row, L, poff);
                sc_row = (const char *)rc.sc;
                zp_row = (const char *)rc.zp;
                sk = SK_F32;
                zk = ZK_I32;
            }
            (level >= 2 ? lanes512 : lanes256)(J->src + e, J->out + e * J->out_size, sc_row + col * SCALE_SIZE[sk],
                                               zp_row ? zp_row + col * ZP_SIZE[zk] : NULL, n, J->src_kind,
                                               J->dst_kind, J->zmode, sk, zk, J->stream);
            goto next_row;
        }
#endif
        for (Py_ssize_t j = 0; j < n; j += STAGE) {
            Py_ssize_t m = n - j < STAGE ? n - j : STAGE, c = col + j;
            const float *sc = (const float *)sc_row;
            const int32_t *zp = (const int32_t *)zp_row;
            float sbuf[STAGE];
            int32_t zbuf[STAGE];
            if (narrow_params) {
                /* the groups this block touches (at most STAGE / 2 + 2 of them, g >= 2), or its
                   elements' params (g == 1: where kernels/native.py did not widen them) */
                Py_ssize_t g0 = c / g, count = (c + m - 1) / g - g0 + 1;
                widened(J, sc_row, zp_row, g0, count, sbuf, zbuf, &sc, &zp);
                c -= g0 * g;
            }
#ifdef HAVE_FUSED
            if (tables) {
                (level >= 2 ? table512 : table256)(J->src + e + j, J->out + (e + j) * J->out_size, sc, zp, c, m, g,
                                                   J->src_kind, J->dst_kind, J->zmode, J->stream);
                continue;
            }
#endif
            if (staged) {
                float buf[STAGE];
                segment(J->src + e + j, buf, sc, zp, c, m, g, J->src_kind, DST_F32, J->zmode);
                emit_best(buf, J->out + (e + j) * J->out_size, m, J->dst_kind, J->stream);
            } else {
                segment(J->src + e + j, J->out + (e + j) * J->out_size, sc, zp, c, m, g, J->src_kind, J->dst_kind,
                        J->zmode);
            }
        }
#ifdef HAVE_FUSED
    next_row:
#endif
        e += n;
        col = 0;
        for (int d = k - 2; d >= 0; d--) { /* next row: carry through the outer dims */
            poff += J->pstride[d];
            if (++idx[d] < J->dims[d]) break;
            poff -= idx[d] * J->pstride[d];
            idx[d] = 0;
        }
    }
    if (J->stream && emit_best)
        fence();
#ifdef HAVE_FUSED
    row_cache_close(&rc);
#endif
}

/* Whether the job's kinds are ones this file knows (else a ValueError is set). */
static int kinds_ok(const Job *J) {
    if (J->src_kind < SRC_I8 || J->src_kind > SRC_U4 || J->dst_kind < DST_F32 || J->dst_kind > DST_BF16 ||
        J->zmode < ZP_NONE || J->zmode > ZP_WIDE || J->sk < SK_F32 || J->sk > SK_BF16 || J->zk < ZK_I32 ||
        J->zk > ZK_U4) {
        PyErr_SetString(PyExc_ValueError, "unknown src, dst, scale or zero-point kind");
        return 0;
    }
    return 1;
}

static int buffer_ok(Py_buffer *b, Py_ssize_t need, const char *what) {
    if (b->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", what, b->len, need);
        return 0;
    }
    return 1;
}

/* dequantize(src, out, scales, zps, dims, varies, src_kind, dst_kind, zmode, start, stop, stream,
              scale_kind, zp_kind) */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    Py_buffer s = {0}, o = {0}, sc = {0}, z = {0};
    PyObject *zobj, *dims, *varies;
    Job J;
    Py_ssize_t start, stop;
    PyObject *result = NULL;
    memset(&J, 0, sizeof J);
    if (!PyArg_ParseTuple(args, "y*w*y*OO!O!iiinnpii", &s, &o, &sc, &zobj, &PyTuple_Type, &dims, &PyTuple_Type,
                          &varies, &J.src_kind, &J.dst_kind, &J.zmode, &start, &stop, &J.stream, &J.sk, &J.zk))
        return NULL;
    if (zobj != Py_None && PyObject_GetBuffer(zobj, &z, PyBUF_SIMPLE) < 0)
        goto done;
    J.k = (int)PyTuple_GET_SIZE(dims);
    if (J.k < 1 || J.k > MAX_DIMS || PyTuple_GET_SIZE(varies) != J.k) {
        PyErr_SetString(PyExc_ValueError, "dims and varies: 1 to 32 of each, as many of one as the other");
        goto done;
    }
    if (!kinds_ok(&J))
        goto done;
    if ((J.zmode == ZP_NONE) != (zobj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "zmode says no zero points, or zps are missing");
        goto done;
    }
    Py_ssize_t n = 1, np_ = 1;
    for (int d = J.k - 1; d >= 0; d--) {
        J.dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(dims, d));
        int v = PyObject_IsTrue(PyTuple_GET_ITEM(varies, d));
        if (PyErr_Occurred() || v < 0) goto done;
        if (J.dims[d] < 1) {
            PyErr_SetString(PyExc_ValueError, "dims must be positive");
            goto done;
        }
        J.pstride[d] = v ? np_ : 0;
        if (v) np_ *= J.dims[d];
        n *= J.dims[d];
    }
    J.out_size = J.dst_kind == DST_F32 ? 4 : 2;
    /* the row: the last dim, or the last two when params vary along the one but not the
       other (groups along the last dim: a row of whole groups, fewer and longer rows) */
    if (J.pstride[J.k - 1] != 0) {
        J.g = 1;
    } else if (J.k >= 2 && J.pstride[J.k - 2] != 0) {
        J.g = J.dims[J.k - 1];
        J.dims[J.k - 2] *= J.dims[J.k - 1];
        J.k--;
    } else {
        J.g = J.dims[J.k - 1] + 1; /* more than a row: the params never change along one */
    }
    if (!buffer_ok(&s, n, "src") || !buffer_ok(&o, n * J.out_size, "out") ||
        !buffer_ok(&sc, np_ * SCALE_SIZE[J.sk], "scales") || (z.buf && !buffer_ok(&z, np_ * ZP_SIZE[J.zk], "zps")))
        goto done;
    if (start < 0 || stop > n || start > stop) {
        PyErr_SetString(PyExc_ValueError, "start and stop must lie within the view");
        goto done;
    }
    J.src = s.buf;
    J.out = o.buf;
    J.scales = sc.buf;
    J.zps = z.buf;  /* (J.sk, J.zk: as parsed) */
    if (stop > start) {
        Py_BEGIN_ALLOW_THREADS
        run_range(&J, start, stop);
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    PyBuffer_Release(&sc);
    if (z.buf) PyBuffer_Release(&z);
    return result;
}

/* The roundings alone, built like run_range, so that a test of them tests the kernel's. */
CLONES static void narrow_range(const float *f, uint16_t *u, Py_ssize_t n, int dst) {
    if (dst == DST_F16)
        for (Py_ssize_t i = 0; i < n; i++) u[i] = to_f16(f[i]);
    else
        for (Py_ssize_t i = 0; i < n; i++) u[i] = to_bf16(f[i]);
}

/* dequantize_one(src, out, scale, zp, src_kind, dst_kind): one scale (a Python float, which
   holds any float32 exactly) and one zero point (a Python int, or None) for the whole of
   src.  A tiny call's cost is its overhead; this entry skips the parameter arrays. */
static PyObject *py_dequantize_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "dequantize_one takes 6 arguments");
        return NULL;
    }
    Py_buffer s = {0}, o = {0};
    Job J;
    memset(&J, 0, sizeof J);
    float scale = (float)PyFloat_AsDouble(args[2]);
    long long zp = args[3] == Py_None ? 0 : PyLong_AsLongLong(args[3]);
    J.src_kind = PyLong_AsLong(args[4]);
    J.dst_kind = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (!kinds_ok(&J))
        return NULL;
    if (zp < INT32_MIN || zp > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a zero point beyond int32");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &s, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &o, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    J.out_size = J.dst_kind == DST_F32 ? 4 : 2;
    Py_ssize_t n = s.len;
    if (o.len < n * J.out_size) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, %zd needed", o.len, n * J.out_size);
    } else {
        int32_t z = (int32_t)zp;
        J.k = 1;
        J.dims[0] = n > 0 ? n : 1;
        J.g = J.dims[0] + 1;
        J.src = s.buf;
        J.out = o.buf;
        J.scales = (const char *)&scale;
        J.zps = args[3] == Py_None ? NULL : (const char *)&z;
        J.zmode = args[3] == Py_None ? ZP_NONE : (zp >= -NARROW_ZP && zp <= NARROW_ZP ? ZP_NARROW : ZP_WIDE);
        if (n > 4096) { /* (below, the GIL's round trip would cost more than the loop) */
            Py_BEGIN_ALLOW_THREADS
            run_range(&J, 0, n);
            Py_END_ALLOW_THREADS
        } else if (n > 0) {
            run_range(&J, 0, n);
        }
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    return result;
}

/* The parameters widened for the kernel (as NumPy's and ml_dtypes' casts do, bit for bit):
   float16 / bfloat16 scales to float32, 4- and 8-bit zero points to int32.  NumPy's
   float16 cast and ml_dtypes' int4 cast cost more than the whole dequantization of a
   large per_group tensor (its parameters are a 32nd of it), hence these loops. */



/* widen(in_bytes, out_bytes, kind) */
static PyObject *py_widen(PyObject *self, PyObject *args) {
    Py_buffer in = {0}, out = {0};
    int kind;
    if (!PyArg_ParseTuple(args, "y*w*i", &in, &out, &kind))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = kind <= W_BF16 ? in.len / 2 : in.len;
    if (kind < W_F16 || kind > W_U4 || out.len < n * 4) {
        PyErr_SetString(PyExc_ValueError, "unknown kind, or out smaller than 4 bytes an element");
    } else {
        Py_BEGIN_ALLOW_THREADS
        widen_range(in.buf, out.buf, n, kind);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return result;
}

/* Whether this CPU has level n (else a ValueError is set). */
static int level_ok(long n) {
    if (n >= 0 && n <= cpu_level) return 1;
    PyErr_Format(PyExc_ValueError, "level %ld: this CPU has levels 0 to %d", n, cpu_level);
    return 0;
}

/* narrow(f32_bytes, out_bytes, dst_kind, level): the rounding the kernel does at a CPU
   level: 0 the plain C one (what machines without AVX2/F16C run), 1 AVX2/F16C, 2 AVX-512;
   a level above the CPU's is refused. */
static PyObject *py_narrow(PyObject *self, PyObject *args) {
    Py_buffer p = {0}, o = {0};
    int dst, at;
    if (!PyArg_ParseTuple(args, "y*w*ii", &p, &o, &dst, &at))
        return NULL;
    Py_ssize_t n = p.len / 4;
    PyObject *result = NULL;
    if ((dst != DST_F16 && dst != DST_BF16) || o.len < n * 2) {
        PyErr_SetString(PyExc_ValueError, "dst_kind must be float16 or bfloat16, out 2 bytes an element");
    } else if (level_ok(at)) {
        emit_fn fn = emit_for(at);
        Py_BEGIN_ALLOW_THREADS
        if (fn)
            fn(p.buf, o.buf, n, dst, 0);
        else
            narrow_range(p.buf, o.buf, n, dst);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&p);
    PyBuffer_Release(&o);
    return result;
}

static PyObject *py_cpu_level(PyObject *self, PyObject *unused) { return PyLong_FromLong(cpu_level); }

static PyObject *py_level(PyObject *self, PyObject *unused) { return PyLong_FromLong(level); }

/* set_level(n): run at level n (0 to cpu_level) from now on; for tests of the lower levels'
   paths on a machine that has a higher one. */
static PyObject *py_set_level(PyObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if ((n == -1 && PyErr_Occurred()) || !level_ok(n)) return NULL;
    level = (int)n;
    emit_best = emit_for(level);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"dequantize", py_dequantize, METH_VARARGS, "Elements [start, stop) of a dequantization (see kernels/native.py)."},
    {"narrow", py_narrow, METH_VARARGS, "float32 -> float16 (1) or bfloat16 (2) bits, as the kernel rounds at a level."},
    {"dequantize_one", (PyCFunction)(void (*)(void))py_dequantize_one, METH_FASTCALL,
     "src, out, scale, zp, src_kind, dst_kind: one scale and zero point for all of src (see kernels/native.py)."},
    {"widen", py_widen, METH_VARARGS, "float16/bfloat16 -> float32, int8/uint8/int4/uint4 -> int32 (kinds 0-5)."},
    {"cpu_level", py_cpu_level, METH_NOARGS, "The CPU's level: 0 plain C, 1 AVX2/F16C, 2 AVX-512."},
    {"level", py_level, METH_NOARGS, "The level the kernel runs at (cpu_level unless set_level lowered it)."},
    {"set_level", py_set_level, METH_O, "Run at a level from 0 to cpu_level (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    detect_cpu();
    level = cpu_level;
    emit_best = emit_for(level);
    return PyModule_Create(&module);
}
