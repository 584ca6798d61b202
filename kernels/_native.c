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
  and zps (int32 or 4/8-bit) are contiguous, of the varying dims' shape, and
  widened to float32 / int32 where they change at every element (see SK_F32);
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
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DIMS 32

enum { SRC_I8, SRC_U8, SRC_I4, SRC_U4 };
enum { DST_F32, DST_F16, DST_BF16 };
enum { ZP_NONE, ZP_NARROW, ZP_WIDE };
/* |zp| up to this: src - zp fits in int32 for every src (|src| <= 255); native.py's _NARROW_ZP */
#define NARROW_ZP ((1LL << 31) - 256)

#define INLINE static inline __attribute__((always_inline))

/* Built for each x86-64 level; glibc picks the best the CPU has when the module loads. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

INLINE uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
INLINE float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float32 -> float16, nearest even; NaN -> 0x7E00 (no sign, no payload).
   Each of the three cases is computed for every element and one is selected, so the
   loop has no branch and the compiler vectorizes it:
   * |f| >= 65536 (or Inf/NaN): Inf, or the canonical NaN;
   * |f| < 2**-14: |f| + 0.5 rounds |f| to a multiple of 2**-24 (float16's subnormal
     spacing, the ulp of 0.5 in float32); the bits above 0.5's are the float16's;
   * else: rebase the exponent (-112), add half an ulp less one plus the kept lsb
     (nearest even), drop 13 bits; a carry into the exponent is the right result,
     65520 and up included (they reach 0x7C00, Inf). */
INLINE uint16_t to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t a = (int32_t)(x & 0x7FFFFFFFu);
    uint32_t big = a > 0x7F800000 ? 0x7E00u : 0x7C00u;
    uint32_t sub = f32_bits(bits_f32((uint32_t)a) + 0.5f) - 0x3F000000u;
    uint32_t nrm = ((uint32_t)a + 0xC8000FFFu + (((uint32_t)a >> 13) & 1u)) >> 13;
    uint32_t is_big = 0u - (uint32_t)(a >= 0x47800000), is_sub = 0u - (uint32_t)(a < 0x38800000);
    uint32_t o = (big & is_big) | (sub & is_sub) | (nrm & ~(is_big | is_sub)); /* masks: no branch */
    return (uint16_t)(o | (sign & ~(0u - (uint32_t)(a > 0x7F800000))));
}

/* float32 -> bfloat16, nearest even, as ml_dtypes (Eigen) casts: a NaN keeps its sign
   and becomes 0x7FC0; subnormals are kept. */
INLINE uint16_t to_bf16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = ((x >> 16) & 0x8000u) | 0x7FC0u;
    return (uint16_t)((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : r);
}

INLINE int32_t load(const uint8_t *s, Py_ssize_t j, int src) {
    uint8_t b = s[j];
    switch (src) {
    case SRC_I8: return (int8_t)b;
    case SRC_U8: return b;
    case SRC_I4: return (int32_t)(int8_t)(uint8_t)(b << 4) >> 4;
    default: return b & 15;
    }
}

INLINE float diff(const uint8_t *s, Py_ssize_t j, int src, int zmode, int32_t z) {
    int32_t v = load(s, j, src);
    if (zmode == ZP_NONE) return (float)v;
    if (zmode == ZP_NARROW) return (float)(v - z);
    return (float)((int64_t)v - (int64_t)z);
}

INLINE void store(void *o, Py_ssize_t j, int dst, float p) {
    switch (dst) {
    case DST_F32: ((float *)o)[j] = p; break;
    case DST_F16: ((uint16_t *)o)[j] = to_f16(p); break;
    default: ((uint16_t *)o)[j] = to_bf16(p); break;
    }
}

/* The parameters as the caller gives them: scales float32, float16 or bfloat16, zero points
   int32 or 4/8-bit.  Where they change at every element (g == 1) they come widened to
   float32 / int32 (kernels/native.py); where they hold for a group, run_range widens the
   few each block of STAGE elements needs into a small buffer (widen_range, vectorized), so
   no pass over all of them precedes the work and the loops below see float32 / int32 only. */
enum { SK_F32, SK_F16, SK_BF16 };
enum { ZK_I32, ZK_I8, ZK_U8, ZK_I4, ZK_U4 };
static const int SCALE_SIZE[] = {4, 2, 2}, ZP_SIZE[] = {4, 1, 1, 1, 1};
enum { W_F16, W_BF16, W_I8, W_U8, W_I4, W_U4 }; /* widen_range's kinds */
static const int SCALE_WIDEN[] = {-1, W_F16, W_BF16}, ZP_WIDEN[] = {-1, W_I8, W_U8, W_I4, W_U4};

INLINE uint32_t f16_to_f32_bits(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3FFu;
    uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
    uint32_t special = sign | 0x7F800000u | (m << 13); /* Inf, NaN (payload kept, as NumPy does) */
    uint32_t sub = sign | f32_bits((float)m * 0x1p-24f); /* exact: m < 2**10 */
    uint32_t is_sub = 0u - (uint32_t)(e == 0), is_special = 0u - (uint32_t)(e == 31); /* masks: no branch */
    return (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
}

/* One run of n elements with one zp and one scale. */
INLINE void run_const(const uint8_t *s, void *o, float c, int32_t z, Py_ssize_t n, int src, int dst, int zmode) {
    for (Py_ssize_t j = 0; j < n; j++)
        store(o, j, dst, diff(s, j, src, zmode, z) * c);
}

/* n elements from column `col` of a row whose params change every g columns (g == 1:
   at every element; g >= the row's length: never).  Every combination of the kinds is
   its own loop once inlined into `segment`. */
INLINE void seg(const uint8_t *s, void *o, const float *sc, const int32_t *zp, Py_ssize_t col, Py_ssize_t n,
                Py_ssize_t g, int src, int dst, int zmode) {
    if (g == 1) {
        sc += col;
        zp = zmode == ZP_NONE ? zp : zp + col;
        for (Py_ssize_t j = 0; j < n; j++)
            store(o, j, dst, diff(s, j, src, zmode, zmode == ZP_NONE ? 0 : zp[j]) * sc[j]);
        return;
    }
    Py_ssize_t gi = col / g, off = col % g, j = 0;
    const int out_size = dst == DST_F32 ? 4 : 2;
    while (j < n) {
        Py_ssize_t m = g - off < n - j ? g - off : n - j;
        const float c = sc[gi];
        const int32_t z = zmode == ZP_NONE ? 0 : zp[gi];
        char *oj = (char *)o + j * out_size;
        /* the usual group sizes as constants: a loop of known length unrolls into a few
           vector instructions, where one of unknown length pays its set-up at every group */
        switch (m) {
        case 32: run_const(s + j, oj, c, z, 32, src, dst, zmode); break;
        case 64: run_const(s + j, oj, c, z, 64, src, dst, zmode); break;
        case 128: run_const(s + j, oj, c, z, 128, src, dst, zmode); break;
        default: run_const(s + j, oj, c, z, m, src, dst, zmode); break;
        }
        j += m;
        gi++;
        off = 0;
    }
}

#define SEG(SRC, DST, Z) seg(s, o, sc, zp, col, n, g, SRC, DST, Z)
#define BY_ZP(SRC, DST) \
    (zmode == ZP_NONE ? SEG(SRC, DST, ZP_NONE) : zmode == ZP_NARROW ? SEG(SRC, DST, ZP_NARROW) : SEG(SRC, DST, ZP_WIDE))
#define BY_DST(SRC) \
    (dst == DST_F32 ? BY_ZP(SRC, DST_F32) : dst == DST_F16 ? BY_ZP(SRC, DST_F16) : BY_ZP(SRC, DST_BF16))

INLINE void segment(const uint8_t *s, void *o, const float *sc, const int32_t *zp, Py_ssize_t col, Py_ssize_t n,
                    Py_ssize_t g, int src, int dst, int zmode) {
    switch (src) {
    case SRC_I8: BY_DST(SRC_I8); break;
    case SRC_U8: BY_DST(SRC_U8); break;
    case SRC_I4: BY_DST(SRC_I4); break;
    default: BY_DST(SRC_U4); break;
    }
}

/* Writing the output, where the CPU has AVX2 and F16C (or AVX-512): the products are
   staged as float32 in a block that stays in L1, then converted 8 at a time and
   stored.  float16 goes through the CPU's own conversion (nearest even), a NaN (bits
   above 0x7C00 once the sign is off) made 0x7E00; bfloat16 through the same integer
   rounding as to_bf16.  With `stream`, stores bypass the cache (non-temporal): a large
   output is then written without first being read into the cache, which is most of
   what memory costs (oneDNN's reorders write so too); small outputs are kept in cache
   for whatever reads them next. */
typedef void (*emit_fn)(const float *f, char *o, Py_ssize_t n, int dst, int stream);
static emit_fn emit_best = NULL; /* NULL: no vector emit; the fused loop writes the output */
#define STAGE 2048

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,f16c")))

AVX2 static inline __m128i bf16x8(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i r = _mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF));
    r = _mm256_srli_epi32(_mm256_add_epi32(r, _mm256_and_si256(hi, _mm256_set1_epi32(1))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7FC0));
    r = _mm256_blendv_epi8(r, qnan, nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)); /* all <= 0xFFFF */
}

AVX2 static inline __m128i f16x8(__m256 v) {
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7C00));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7E00), nan);
}

/* Elements stored one by one up to the first `align`-byte boundary of the output, where
   non-temporal vector stores may start (all n of them, for an array not element-aligned). */
INLINE Py_ssize_t store_until_aligned(const float *f, char *o, Py_ssize_t n, int dst, uintptr_t align) {
    const int size = dst == DST_F32 ? 4 : 2;
    Py_ssize_t i = 0;
    while (i < n && ((uintptr_t)(o + i * size) & (align - 1)) != 0) {
        store(o, i, dst, f[i]);
        i++;
    }
    return i;
}

AVX2 static void emit(const float *f, char *o, Py_ssize_t n, int dst, int stream) {
    const int size = dst == DST_F32 ? 4 : 2;
    Py_ssize_t i = stream ? store_until_aligned(f, o, n, dst, 8 * size) : 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(f + i);
        if (dst == DST_F32) {
            if (stream) _mm256_stream_ps((float *)o + i, v);
            else _mm256_storeu_ps((float *)o + i, v);
        } else {
            const __m128i h = dst == DST_F16 ? f16x8(v) : bf16x8(v);
            if (stream) _mm_stream_si128((__m128i *)((uint16_t *)o + i), h);
            else _mm_storeu_si128((__m128i *)((uint16_t *)o + i), h);
        }
    }
    for (; i < n; i++)
        store(o, i, dst, f[i]);
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

/* emit's AVX-512 twin: 16 elements a step, NaNs found by one compare into a mask. */
AVX512 static void emit512(const float *f, char *o, Py_ssize_t n, int dst, int stream) {
    const int size = dst == DST_F32 ? 4 : 2;
    Py_ssize_t i = stream ? store_until_aligned(f, o, n, dst, 16 * size) : 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(f + i);
        if (dst == DST_F32) {
            if (stream) _mm512_stream_ps((float *)o + i, v);
            else _mm512_storeu_ps((float *)o + i, v);
            continue;
        }
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __m256i h;
        if (dst == DST_F16) {
            h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            h = _mm256_mask_blend_epi16(nan, h, _mm256_set1_epi16(0x7E00));
        } else {
            const __m512i x = _mm512_castps_si512(v);
            const __m512i hi = _mm512_srli_epi32(x, 16);
            __m512i r = _mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF));
            r = _mm512_srli_epi32(_mm512_add_epi32(r, _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
            const __m512i qnan = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)),
                                                 _mm512_set1_epi32(0x7FC0));
            h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, qnan));
        }
        if (stream) _mm256_stream_si256((__m256i *)((uint16_t *)o + i), h);
        else _mm256_storeu_si256((__m256i *)((uint16_t *)o + i), h);
    }
    for (; i < n; i++)
        store(o, i, dst, f[i]);
}

static void fence(void) { _mm_sfence(); } /* non-temporal stores made visible before we return */

/* the widest emit the CPU has (AVX-512, AVX2 + F16C), and what each level may use */
static int cpu_level = 0;
static void detect_cpu(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        cpu_level = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            cpu_level = 2;
    }
}
static emit_fn emit_for(int level) { return level >= 2 ? emit512 : level == 1 ? emit : NULL; }
#else
static int cpu_level = 0;
static void fence(void) {}
static void detect_cpu(void) {}
static emit_fn emit_for(int level) { return NULL; }
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
    const int own = g > 1 && (J->sk != SK_F32 || (J->zps && J->zk != ZK_I32)); /* params to widen here */
    const int staged = emit_best && (J->stream || J->dst_kind == DST_F16);
    Py_ssize_t e = start;
    while (e < stop) {
        Py_ssize_t n = L - col < stop - e ? L - col : stop - e;
        const char *sc_row = J->scales + poff * SCALE_SIZE[J->sk];
        const char *zp_row = J->zps ? J->zps + poff * ZP_SIZE[J->zk] : NULL;
        for (Py_ssize_t j = 0; j < n; j += STAGE) {
            Py_ssize_t m = n - j < STAGE ? n - j : STAGE, c = col + j;
            const float *sc = (const float *)sc_row;
            const int32_t *zp = (const int32_t *)zp_row;
            float sbuf[STAGE / 2 + 2];
            int32_t zbuf[STAGE / 2 + 2];
            if (own) { /* the groups this block touches (at most STAGE / 2 + 2 of them, g >= 2) */
                Py_ssize_t g0 = c / g, count = (c + m - 1) / g - g0 + 1;
                if (J->sk == SK_F32) sc += g0;
                else { widen_range(sc_row + g0 * 2, sbuf, count, SCALE_WIDEN[J->sk]); sc = sbuf; }
                if (zp_row && J->zk == ZK_I32) zp += g0;
                else if (zp_row) { widen_range(zp_row + g0, zbuf, count, ZP_WIDEN[J->zk]); zp = zbuf; }
                c -= g0 * g;
            }
            if (staged) {
                float buf[STAGE];
                segment(J->src + e + j, buf, sc, zp, c, m, g, J->src_kind, DST_F32, J->zmode);
                emit_best(buf, J->out + (e + j) * J->out_size, m, J->dst_kind, J->stream);
            } else {
                segment(J->src + e + j, J->out + (e + j) * J->out_size, sc, zp, c, m, g, J->src_kind, J->dst_kind,
                        J->zmode);
            }
        }
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
    if (J.g == 1 && (J.sk != SK_F32 || J.zk != ZK_I32)) {
        PyErr_SetString(PyExc_ValueError, "parameters that change at every element must come as float32 / int32");
        goto done;
    }
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

/* narrow(f32_bytes, out_bytes, dst_kind, level): the rounding the kernel does at a CPU
   level: 0 the plain C one (what machines without AVX2/F16C run), 1 AVX2/F16C, 2 AVX-512;
   a level above the CPU's is refused. */
static PyObject *py_narrow(PyObject *self, PyObject *args) {
    Py_buffer p = {0}, o = {0};
    int dst, level;
    if (!PyArg_ParseTuple(args, "y*w*ii", &p, &o, &dst, &level))
        return NULL;
    Py_ssize_t n = p.len / 4;
    PyObject *result = NULL;
    if ((dst != DST_F16 && dst != DST_BF16) || o.len < n * 2) {
        PyErr_SetString(PyExc_ValueError, "dst_kind must be float16 or bfloat16, out 2 bytes an element");
    } else if (level < 0 || level > cpu_level) {
        PyErr_Format(PyExc_ValueError, "level %d: this CPU has levels 0 to %d", level, cpu_level);
    } else {
        emit_fn fn = emit_for(level);
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

static PyMethodDef methods[] = {
    {"dequantize", py_dequantize, METH_VARARGS, "Elements [start, stop) of a dequantization (see kernels/native.py)."},
    {"narrow", py_narrow, METH_VARARGS, "float32 -> float16 (1) or bfloat16 (2) bits, as the kernel rounds at a level."},
    {"dequantize_one", (PyCFunction)(void (*)(void))py_dequantize_one, METH_FASTCALL,
     "src, out, scale, zp, src_kind, dst_kind: one scale and zero point for all of src (see kernels/native.py)."},
    {"widen", py_widen, METH_VARARGS, "float16/bfloat16 -> float32, int8/uint8/int4/uint4 -> int32 (kinds 0-5)."},
    {"cpu_level", py_cpu_level, METH_NOARGS, "0: plain C, 1: AVX2/F16C, 2: AVX-512 (how emit writes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    detect_cpu();
    emit_best = emit_for(cpu_level);
    return PyModule_Create(&module);
}
