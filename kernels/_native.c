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
#include <stdlib.h>
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
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define HAVE_FUSED 1

/* Non-temporal stores in 16-byte pieces: they need the output aligned to 16 bytes only,
   which large NumPy arrays are, so that no element is stored through the cache beside
   streamed ones where a block or a row starts or ends (a line written both ways costs more
   than the whole block saves; 32- and 64-byte stores made a head of cached stores in each
   block, 15-40% slower). */
AVX2 static inline void stream32(char *o, __m256i w) {
    _mm_stream_si128((__m128i *)o, _mm256_castsi256_si128(w));
    _mm_stream_si128((__m128i *)(o + 16), _mm256_extracti128_si256(w, 1));
}

AVX512 static inline void stream64(char *o, __m512i w) {
    _mm_stream_si128((__m128i *)o, _mm512_castsi512_si128(w));
    _mm_stream_si128((__m128i *)(o + 16), _mm512_extracti32x4_epi32(w, 1));
    _mm_stream_si128((__m128i *)(o + 32), _mm512_extracti32x4_epi32(w, 2));
    _mm_stream_si128((__m128i *)(o + 48), _mm512_extracti32x4_epi32(w, 3));
}

/* 8 products rounded to bfloat16 as to_bf16 rounds, the result in each lane's high half */
AVX2 static inline __m256i bf16_high(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (!_mm256_movemask_ps(nan)) return r; /* (no NaN, as nearly always: no blend) */
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32((int)0x80000000u)),
                                         _mm256_set1_epi32(0x7FC00000));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan), nan));
}

AVX2 static inline __m128i bf16x8(__m256 v) {
    const __m256i r = _mm256_srli_epi32(bf16_high(v), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)); /* all <= 0xFFFF */
}

AVX2 static inline __m128i f16x8(__m256 v) {
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7C00));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7E00), nan);
}

/* 16 products (p0's 8, then p1's) as float16 or bfloat16 bits, in order, as f16x8 / bf16x8 */
AVX2 static inline __m256i halves16(__m256 p0, __m256 p1, int dst) {
    if (dst == DST_F16) {
        const __m256i h = _mm256_set_m128i(_mm256_cvtps_ph(p1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                           _mm256_cvtps_ph(p0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                               _mm256_set1_epi16(0x7C00));
        return _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00), nan);
    }
    const __m256i r = _mm256_packus_epi32(_mm256_srli_epi32(bf16_high(p0), 16), _mm256_srli_epi32(bf16_high(p1), 16));
    return _mm256_permute4x64_epi64(r, 0xD8); /* packus interleaves the 128-bit lanes */
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
    Py_ssize_t i = stream ? store_until_aligned(f, o, n, dst, 16) : 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(f + i);
        if (dst == DST_F32) {
            if (stream) stream32((char *)((float *)o + i), _mm256_castps_si256(v));
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


/* 16 products to float16 (the CPU's nearest-even conversion, NaN made 0x7E00) or to
   bfloat16 (to_bf16's integer rounding), NaNs found by one compare into a mask. */
AVX512 INLINE __m256i half16(__m512 v, int dst) {
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (dst == DST_F16) {
        const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        return _mm256_mask_blend_epi16(nan, h, _mm256_set1_epi16(0x7E00));
    }
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb);
    if (nan) /* (a NaN is rare: a branch costs less than a blend) its sign, and 0x7FC0 */
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(x, _mm512_set1_epi32((int)0x80000000u)),
                                                          _mm512_set1_epi32(0x7FC00000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

/* emit's AVX-512 twin: 16 elements a step. */
AVX512 static void emit512(const float *f, char *o, Py_ssize_t n, int dst, int stream) {
    Py_ssize_t i = stream ? store_until_aligned(f, o, n, dst, 16) : 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(f + i);
        if (dst == DST_F32) {
            if (stream) stream64((char *)((float *)o + i), _mm512_castps_si512(v));
            else _mm512_storeu_ps((float *)o + i, v);
            continue;
        }
        const __m256i h = half16(v, dst);
        if (stream) stream32((char *)((uint16_t *)o + i), h);
        else _mm256_storeu_si256((__m256i *)((uint16_t *)o + i), h);
    }
    for (; i < n; i++)
        store(o, i, dst, f[i]);
}

/* The fused loops of AVX-512 machines: the output written as it is computed, with no
   staging block between (emit needs one for its aligned non-temporal stores; these align
   their own vectors, doing the head and the tail with masked loads and stores).  Two
   forms, each chosen by run_range where it holds and zmode is not ZP_WIDE:

   * lanes512: parameters that change at every element (g == 1), read as given (float16
     through the CPU's exact conversion, bfloat16 by a shift, 4/8-bit zero points by
     sign or zero extension), so nothing is widened before the threads start;
   * table512: 4-bit src with parameters that hold for runs of g >= 16: src has 16
     values, so a group's outputs are a table of 16, computed as one vector by the same
     arithmetic (hence the same bits) and looked up by each element's nibble with one
     permute (vpermw / vpermd), two or three where a vector spans groups. */
enum { OUT_MASKED, OUT_PLAIN, OUT_STREAM };

/* The entry points below are compiled for AVX-512 whatever clone of run_range calls them,
   so the kinds are made constants here (a switch over every combination, as segment's)
   rather than in run_range, which GCC cannot inline them into. */

/* 16 bytes of src (lanes in k) as int32 */
AVX512 INLINE __m512i src16(const uint8_t *s, __mmask16 k, int full, int src) {
    const __m128i b = full ? _mm_loadu_si128((const __m128i *)s) : _mm_maskz_loadu_epi8(k, s);
    switch (src) {
    case SRC_I8: return _mm512_cvtepi8_epi32(b);
    case SRC_U8: return _mm512_cvtepu8_epi32(b);
    case SRC_I4: return _mm512_srai_epi32(_mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 28), 28);
    default: return _mm512_and_si512(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(15));
    }
}

/* 16 scales as float32: float16 by vcvtph2ps, exact (a signaling NaN comes out quiet, as
   the multiply would make it: the product's bits are the same), bfloat16 by a shift */
AVX512 INLINE __m512 scales16(const char *p, __mmask16 k, int full, int sk) {
    if (sk == SK_F32) return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
    const __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(k, p);
    if (sk == SK_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 zero points as int32: int32 as given (zk ZK_I32), or bytes of any of the 1-byte kinds
   (zk ZK_I8 standing for all four) as ((b & keep) ^ sign) - sign: the kind's bits, sign-
   extended from its top bit where it has a sign (sign 0 where not); one loop for four kinds */
AVX512 INLINE __m512i zps16(const char *p, __mmask16 k, int full, int zk, __m512i keep, __m512i sign) {
    if (zk == ZK_I32) return full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(k, p);
    const __m128i b = full ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(k, p);
    const __m512i x = _mm512_and_si512(_mm512_cvtepu8_epi32(b), keep);
    return _mm512_sub_epi32(_mm512_xor_si512(x, sign), sign);
}

/* 16 outputs: all (OUT_PLAIN), through the cache or not (OUT_STREAM: 16-byte aligned), or those in k */
AVX512 INLINE void put16(char *o, __m512 p, __mmask16 k, int mode, int dst) {
    if (dst == DST_F32) {
        if (mode == OUT_STREAM) stream64(o, _mm512_castps_si512(p));
        else if (mode == OUT_PLAIN) _mm512_storeu_ps(o, p);
        else _mm512_mask_storeu_ps(o, k, p);
        return;
    }
    const __m256i h = half16(p, dst);
    if (mode == OUT_STREAM) stream32(o, h);
    else if (mode == OUT_PLAIN) _mm256_storeu_si256((__m256i *)o, h);
    else _mm256_mask_storeu_epi16(o, k, h);
}

/* Elements before the first `vec`-byte boundary of o (none for an o not element-aligned,
   which is then written without streaming), at most n. */
INLINE Py_ssize_t head_of(const char *o, Py_ssize_t n, int size, int vec) {
    if ((uintptr_t)o % size) return 0;
    Py_ssize_t h = (Py_ssize_t)((vec - (uintptr_t)o % vec) % vec) / size;
    return h < n ? h : n;
}

AVX512 INLINE void lanes_step(const uint8_t *s, char *o, const char *sc, const char *zp, Py_ssize_t i,
                              __mmask16 k, int mode, int src, int dst, int zmode, int sk, int zk, __m512i keep,
                              __m512i sign) {
    const int full = mode != OUT_MASKED, size = dst == DST_F32 ? 4 : 2;
    __m512i v = src16(s + i, k, full, src);
    if (zmode != ZP_NONE) v = _mm512_sub_epi32(v, zps16(zp + i * ZP_SIZE[zk], k, full, zk, keep, sign));
    const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(v), scales16(sc + i * SCALE_SIZE[sk], k, full, sk));
    put16(o + i * size, p, k, mode, dst);
}

/* n elements whose parameters change at every element, from sc and zp on. */
AVX512 INLINE void lanes_body(const uint8_t *s, char *o, const char *sc, const char *zp, Py_ssize_t n, int src,
                              int dst, int zmode, int sk, int zk, int stream, int zp_kind) {
    const int size = dst == DST_F32 ? 4 : 2;
    const int byte_bits = zp_kind == ZK_I4 || zp_kind == ZK_U4 ? 4 : 8, is_signed = zp_kind == ZK_I8 || zp_kind == ZK_I4;
    const __m512i keep = _mm512_set1_epi32((1 << byte_bits) - 1);
    const __m512i sign = _mm512_set1_epi32(is_signed ? 1 << (byte_bits - 1) : 0);
    Py_ssize_t i = 0, h = stream ? head_of(o, n, size, 16) : 0;
    stream = stream && (uintptr_t)o % size == 0;
#define STEP(I, K, MODE) lanes_step(s, o, sc, zp, I, K, MODE, src, dst, zmode, sk, zk, keep, sign)
    if (h) STEP(0, (__mmask16)((1u << h) - 1), OUT_MASKED);
    for (i = h; i + 16 <= n; i += 16)
        STEP(i, 0xFFFF, stream ? OUT_STREAM : OUT_PLAIN);
    if (i < n) STEP(i, (__mmask16)((1u << (n - i)) - 1), OUT_MASKED);
#undef STEP
}

/* One table per group, of the 16 outputs indexed by src's nibble: float32, or 16-bit
   values repeated in both halves (vpermw indexes 32 words by 5 bits; the fifth, src's
   high nibble's low bit, then picks the same value). */
AVX512 INLINE __m512i table_of(float c, int32_t z, int src, int dst, int zmode) {
    const __m512i nib = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i v = src == SRC_I4 ? _mm512_srai_epi32(_mm512_slli_epi32(nib, 28), 28) : nib;
    if (zmode != ZP_NONE) v = _mm512_sub_epi32(v, _mm512_set1_epi32(z));
    const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(c));
    if (dst == DST_F32) return _mm512_castps_si512(p);
    const __m256i h = half16(p, dst);
    return _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
}

/* W elements (16 for float32, 32 for 16-bit outputs: one 64-byte vector) at i, of which
   those in k are stored; T[gi] is element i's group's table, and the group after it
   starts at element bnd (later groups every g). */
AVX512 INLINE void table_step(const uint8_t *s, char *o, const __m512i *T, Py_ssize_t gi, Py_ssize_t bnd,
                                     Py_ssize_t g, Py_ssize_t i, Py_ssize_t count, int mode, int dst) {
    const int full = mode != OUT_MASKED;
    if (dst == DST_F32) {
        const __mmask16 k = (__mmask16)(full ? 0xFFFF : (1u << count) - 1);
        const __m128i b = full ? _mm_loadu_si128((const __m128i *)(s + i)) : _mm_maskz_loadu_epi8(k, s + i);
        const __m512i idx = _mm512_cvtepu8_epi32(b);
        __m512i t = _mm512_permutexvar_epi32(idx, T[gi]);
        for (Py_ssize_t b0 = bnd; b0 < i + count; b0 += g)
            t = _mm512_mask_permutexvar_epi32(t, (__mmask16)(0xFFFFu << (b0 - i)), idx, T[++gi]);
        put16(o + i * 4, _mm512_castsi512_ps(t), k, mode, DST_F32);
        return;
    }
    const __mmask32 k = full ? 0xFFFFFFFFu : (__mmask32)((1ull << count) - 1);
    const __m256i b = full ? _mm256_loadu_si256((const __m256i *)(s + i)) : _mm256_maskz_loadu_epi8(k, s + i);
    const __m512i idx = _mm512_cvtepu8_epi16(b);
    __m512i t = _mm512_permutexvar_epi16(idx, T[gi]);
    for (Py_ssize_t b0 = bnd; b0 < i + count; b0 += g)
        t = _mm512_mask_permutexvar_epi16(t, (__mmask32)(0xFFFFFFFFu << (b0 - i)), idx, T[++gi]);
    if (mode == OUT_STREAM) stream64(o + i * 2, t);
    else if (mode == OUT_PLAIN) _mm512_storeu_si512(o + i * 2, t);
    else _mm512_mask_storeu_epi16(o + i * 2, k, t);
}

/* m elements of 4-bit src from column c of a row whose params (float32 / int32) change
   every g >= 16 columns (sc[0], zp[0]: column 0's). */
AVX512 INLINE void table_body(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t c,
                                   Py_ssize_t m, Py_ssize_t g, int src, int dst, int zmode, int stream) {
    const Py_ssize_t g0 = c / g, ng = (c + m - 1) / g - g0 + 1;
    __m512i T[STAGE / 16 + 2];
    for (Py_ssize_t t = 0; t < ng; t++)
        T[t] = table_of(sc[g0 + t], zmode == ZP_NONE ? 0 : zp[g0 + t], src, dst, zmode);
    const int size = dst == DST_F32 ? 4 : 2, W = 64 / size;
    Py_ssize_t gi = 0, bnd = (g0 + 1) * g - c; /* element i's table, the next group's first element */
    Py_ssize_t i = stream ? head_of(o, m, size, 16) : 0;
    stream = stream && (uintptr_t)o % size == 0;
    if (i) table_step(s, o, T, gi, bnd, g, 0, i, OUT_MASKED, dst);
    for (;; i += W) {
        while (bnd <= i) { gi++; bnd += g; }
        if (i + W > m) break;
        table_step(s, o, T, gi, bnd, g, i, W, stream ? OUT_STREAM : OUT_PLAIN, dst);
    }
    if (i < m) table_step(s, o, T, gi, bnd, g, i, m - i, OUT_MASKED, dst);
}

#define LANES(SRC, DST, Z, SK, ZK) BODY(s, o, sc, zp, n, SRC, DST, Z, SK, ZK, stream, zk)
#define LANES_ZK(SRC, DST, SK)                                  \
    (zmode == ZP_NONE ? LANES(SRC, DST, ZP_NONE, SK, ZK_I32)    \
     : zk == ZK_I32   ? LANES(SRC, DST, ZP_NARROW, SK, ZK_I32)  \
                      : LANES(SRC, DST, ZP_NARROW, SK, ZK_I8)) /* ZK_I8: every 1-byte kind (zps16) */
#define LANES_SK(SRC, DST) \
    (sk == SK_F32 ? LANES_ZK(SRC, DST, SK_F32) : sk == SK_F16 ? LANES_ZK(SRC, DST, SK_F16) : LANES_ZK(SRC, DST, SK_BF16))
#define LANES_DST(SRC) \
    (dst == DST_F32 ? LANES_SK(SRC, DST_F32) : dst == DST_F16 ? LANES_SK(SRC, DST_F16) : LANES_SK(SRC, DST_BF16))

#define LANES_BY_SRC                                  \
    switch (src) {                                    \
    case SRC_I8: LANES_DST(SRC_I8); break;            \
    case SRC_U8: LANES_DST(SRC_U8); break;            \
    case SRC_I4: LANES_DST(SRC_I4); break;            \
    default: LANES_DST(SRC_U4); break;                \
    }

/* lanes_body for zmode ZP_NONE or ZP_NARROW */
#define BODY lanes_body
AVX512 __attribute__((noinline)) static void lanes512(const uint8_t *s, char *o, const char *sc, const char *zp,
                                                      Py_ssize_t n, int src, int dst, int zmode, int sk, int zk,
                                                      int stream) {
    LANES_BY_SRC;
}
#undef BODY

#define TABLE(SRC, DST, Z) table_body(s, o, sc, zp, c, m, g, SRC, DST, Z, stream)
#define TABLE_Z(SRC, DST) (zmode == ZP_NONE ? TABLE(SRC, DST, ZP_NONE) : TABLE(SRC, DST, ZP_NARROW))
#define TABLE_DST(SRC) \
    (dst == DST_F32 ? TABLE_Z(SRC, DST_F32) : dst == DST_F16 ? TABLE_Z(SRC, DST_F16) : TABLE_Z(SRC, DST_BF16))

/* table_body for 4-bit src, zmode ZP_NONE or ZP_NARROW */
AVX512 __attribute__((noinline)) static void table512(const uint8_t *s, char *o, const float *sc, const int32_t *zp,
                                                      Py_ssize_t c, Py_ssize_t m, Py_ssize_t g, int src, int dst,
                                                      int zmode, int stream) {
    if (src == SRC_I4) TABLE_DST(SRC_I4);
    else TABLE_DST(SRC_U4);
}
#undef TABLE
#undef TABLE_DST

/* The fused loops' AVX2 twins (CPUs with AVX2 and F16C but no AVX-512): 16 elements a step for
   lanes256, 32 for table256, whose lookup is two byte shuffles (vpshufb: 16 entries, the low
   and the high bytes of the 16-bit outputs; hence 16-bit outputs only: float32 ones go by
   the staged loop).  AVX2 has no masked byte loads or stores: the head and the tail are
   done element by element, with the same arithmetic. */

/* one element of lanes256: scale and zero point read at i, as product8 reads 8 */
INLINE void lane_one(const uint8_t *s, char *o, const char *sc, const char *zp, Py_ssize_t i, int src, int dst,
                     int zmode, int sk, int zp_kind) {
    const uint16_t *h = (const uint16_t *)sc;
    const float c = sk == SK_F32 ? ((const float *)sc)[i]
                    : sk == SK_F16 ? bits_f32(f16_to_f32_bits(h[i])) : bits_f32((uint32_t)h[i] << 16);
    const int32_t z = zmode == ZP_NONE ? 0
                      : zp_kind == ZK_I32 ? ((const int32_t *)zp)[i]
                                          : load((const uint8_t *)zp, i, zp_kind - ZK_I8 + SRC_I8);
    store(o, i, dst, diff(s, i, src, zmode, z) * c);
}

AVX2 INLINE __m256i src8(const uint8_t *s, int src) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)s);
    switch (src) {
    case SRC_I8: return _mm256_cvtepi8_epi32(b);
    case SRC_U8: return _mm256_cvtepu8_epi32(b);
    case SRC_I4: return _mm256_srai_epi32(_mm256_slli_epi32(_mm256_cvtepu8_epi32(b), 28), 28);
    default: return _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(15));
    }
}

/* 8 products at i */
AVX2 INLINE __m256 product8(const uint8_t *s, const char *sc, const char *zp, Py_ssize_t i, int src, int zmode,
                            int sk, int zk, __m256i keep, __m256i sign) {
    __m256i v = src8(s + i, src);
    if (zmode != ZP_NONE) {
        __m256i z;
        if (zk == ZK_I32) {
            z = _mm256_loadu_si256((const __m256i *)(zp + i * 4));
        } else { /* every 1-byte kind, as zps16 reads them */
            z = _mm256_and_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(zp + i))), keep);
            z = _mm256_sub_epi32(_mm256_xor_si256(z, sign), sign);
        }
        v = _mm256_sub_epi32(v, z);
    }
    __m256 c;
    if (sk == SK_F32) c = _mm256_loadu_ps((const float *)sc + i);
    else {
        const __m128i h = _mm_loadu_si128((const __m128i *)(sc + i * 2));
        c = sk == SK_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), c);
}

AVX2 INLINE void store32(char *o, __m256i w, int stream) {
    if (stream) stream32(o, w);
    else _mm256_storeu_si256((__m256i *)o, w);
}

/* 16 elements at i */
AVX2 INLINE void lanes16(const uint8_t *s, char *o, const char *sc, const char *zp, Py_ssize_t i, int stream,
                         int src, int dst, int zmode, int sk, int zk, __m256i keep, __m256i sign) {
    const __m256 p0 = product8(s, sc, zp, i, src, zmode, sk, zk, keep, sign);
    const __m256 p1 = product8(s, sc, zp, i + 8, src, zmode, sk, zk, keep, sign);
    if (dst == DST_F32) {
        store32(o + i * 4, _mm256_castps_si256(p0), stream);
        store32(o + i * 4 + 32, _mm256_castps_si256(p1), stream);
    } else {
        store32(o + i * 2, halves16(p0, p1, dst), stream);
    }
}

AVX2 INLINE void lanes_body256(const uint8_t *s, char *o, const char *sc, const char *zp, Py_ssize_t n, int src,
                               int dst, int zmode, int sk, int zk, int stream, int zp_kind) {
    const int size = dst == DST_F32 ? 4 : 2;
    const int byte_bits = zp_kind == ZK_I4 || zp_kind == ZK_U4 ? 4 : 8, is_signed = zp_kind == ZK_I8 || zp_kind == ZK_I4;
    const __m256i keep = _mm256_set1_epi32((1 << byte_bits) - 1);
    const __m256i sign = _mm256_set1_epi32(is_signed ? 1 << (byte_bits - 1) : 0);
    Py_ssize_t i = 0, h = stream ? head_of(o, n, size, 16) : 0;
    stream = stream && (uintptr_t)o % size == 0;
    for (; i < h; i++) lane_one(s, o, sc, zp, i, src, dst, zmode, sk, zp_kind);
    for (; i + 16 <= n; i += 16) lanes16(s, o, sc, zp, i, stream, src, dst, zmode, sk, zk, keep, sign);
    for (; i < n; i++) lane_one(s, o, sc, zp, i, src, dst, zmode, sk, zp_kind);
}

/* A group's table for table256: its 16 outputs' low bytes in *lo, high bytes in *hi, each
   in both 128-bit lanes (vpshufb looks up within a lane). */
AVX2 INLINE void table_of256(float c, int32_t z, int src, int dst, int zmode, __m256i *lo, __m256i *hi) {
    __m256i v0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), v1 = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    if (src == SRC_I4) v1 = _mm256_sub_epi32(v1, _mm256_set1_epi32(16)); /* nibbles 8-15: -8 to -1 */
    if (zmode != ZP_NONE) {
        v0 = _mm256_sub_epi32(v0, _mm256_set1_epi32(z));
        v1 = _mm256_sub_epi32(v1, _mm256_set1_epi32(z));
    }
    const __m256 cc = _mm256_set1_ps(c);
    const __m256i w = halves16(_mm256_mul_ps(_mm256_cvtepi32_ps(v0), cc), _mm256_mul_ps(_mm256_cvtepi32_ps(v1), cc), dst);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8); /* low bytes, high bytes */
    *lo = _mm256_permute2x128_si256(a, a, 0x00);
    *hi = _mm256_permute2x128_si256(a, a, 0x11);
}

/* element i's output from table t (T[2t], T[2t + 1]) */
INLINE uint16_t table_word(const __m256i *T, Py_ssize_t t, uint8_t b) {
    return (uint16_t)(((const uint8_t *)&T[2 * t])[b & 15] | ((const uint8_t *)&T[2 * t + 1])[b & 15] << 8);
}

/* 32 elements at i (table_step's twin) */
AVX2 INLINE void table32(const uint8_t *s, char *o, const __m256i *T, Py_ssize_t gi, Py_ssize_t bnd, Py_ssize_t g,
                         Py_ssize_t i, int stream) {
    const __m256i idx = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(s + i)), _mm256_set1_epi8(15));
    __m256i lo = _mm256_shuffle_epi8(T[2 * gi], idx), hi = _mm256_shuffle_epi8(T[2 * gi + 1], idx);
    for (Py_ssize_t b0 = bnd; b0 < i + 32; b0 += g) { /* the groups that start in these 32 */
        const __m256i iota = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                              20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
        const __m256i next = _mm256_cmpgt_epi8(iota, _mm256_set1_epi8((char)(b0 - i - 1)));
        gi++;
        lo = _mm256_blendv_epi8(lo, _mm256_shuffle_epi8(T[2 * gi], idx), next);
        hi = _mm256_blendv_epi8(hi, _mm256_shuffle_epi8(T[2 * gi + 1], idx), next);
    }
    const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi); /* within lanes */
    store32(o + i * 2, _mm256_permute2x128_si256(a, b, 0x20), stream);
    store32(o + i * 2 + 32, _mm256_permute2x128_si256(a, b, 0x31), stream);
}

/* table_body's AVX2 twin, for 16-bit outputs */
AVX2 INLINE void table_body256(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t c,
                               Py_ssize_t m, Py_ssize_t g, int src, int dst, int zmode, int stream) {
    const Py_ssize_t g0 = c / g, ng = (c + m - 1) / g - g0 + 1;
    __m256i T[2 * (STAGE / 16 + 2)];
    for (Py_ssize_t t = 0; t < ng; t++)
        table_of256(sc[g0 + t], zmode == ZP_NONE ? 0 : zp[g0 + t], src, dst, zmode, &T[2 * t], &T[2 * t + 1]);
    Py_ssize_t gi = 0, bnd = (g0 + 1) * g - c, i = 0; /* as in table_body */
    const Py_ssize_t h = stream ? head_of(o, m, 2, 16) : 0;
    stream = stream && (uintptr_t)o % 2 == 0;
    for (;; i++) { /* the head, one by one, then 32 at a time, then the tail */
        while (bnd <= i) { gi++; bnd += g; }
        if (i >= m) break;
        if (i >= h && i + 32 <= m) {
            table32(s, o, T, gi, bnd, g, i, stream);
            i += 31;
        } else {
            ((uint16_t *)o)[i] = table_word(T, gi, s[i]);
        }
    }
}

#define BODY lanes_body256
AVX2 __attribute__((noinline)) static void lanes256(const uint8_t *s, char *o, const char *sc, const char *zp,
                                                    Py_ssize_t n, int src, int dst, int zmode, int sk, int zk,
                                                    int stream) {
    LANES_BY_SRC;
}
#undef BODY

AVX2 __attribute__((noinline)) static void table256(const uint8_t *s, char *o, const float *sc, const int32_t *zp,
                                                    Py_ssize_t c, Py_ssize_t m, Py_ssize_t g, int src, int dst,
                                                    int zmode, int stream) {
#define TABLE(SRC, DST, Z) table_body256(s, o, sc, zp, c, m, g, SRC, DST, Z, stream)
#define TABLE_DST(SRC) (dst == DST_F16 ? TABLE_Z(SRC, DST_F16) : TABLE_Z(SRC, DST_BF16))
    if (src == SRC_I4) TABLE_DST(SRC_I4);
    else TABLE_DST(SRC_U4);
#undef TABLE
#undef TABLE_DST
}

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
static emit_fn emit_for(int level) { return level >= 2 ? emit512 : level == 1 ? emit : NULL; }
#else
static int cpu_level = 0;
static int level = 0;
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
#ifdef HAVE_FUSED
/* A row of params widened to float32 / int32 (see run_range), for the row at poff. */
#define ROW_CACHE 65536
typedef struct {
    float *sc;
    int32_t *zp;
    Py_ssize_t poff; /* whose params they hold; -1: none yet */
} RowCache;

static void row_cache_open(RowCache *rc, Py_ssize_t L) {
    rc->sc = malloc(L * sizeof(float));
    rc->zp = malloc(L * sizeof(int32_t));
    if (!rc->sc || !rc->zp) { /* then the params are read as given */
        free(rc->sc);
        free(rc->zp);
        rc->sc = NULL;
        rc->zp = NULL;
    }
}

static void row_cache_fill(RowCache *rc, const Job *J, const char *sc_row, const char *zp_row, Py_ssize_t L,
                           Py_ssize_t poff) {
    if (rc->poff == poff) return;
    if (J->sk == SK_F32) memcpy(rc->sc, sc_row, L * sizeof(float));
    else widen_range(sc_row, rc->sc, L, SCALE_WIDEN[J->sk]);
    if (zp_row && J->zk == ZK_I32) memcpy(rc->zp, zp_row, L * sizeof(int32_t));
    else if (zp_row) widen_range(zp_row, rc->zp, L, ZP_WIDEN[J->zk]);
    rc->poff = poff;
}

static void row_cache_close(RowCache *rc) {
    free(rc->sc);
    free(rc->zp);
}
#endif

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
    const int narrow_params = J->sk != SK_F32 || (J->zps && J->zk != ZK_I32);
    const int own = g > 1 && narrow_params; /* group params to widen here, block by block */
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
    RowCache rc = {NULL, NULL, -1};
    if (fused && g == 1 && narrow_params && k >= 2 && J->pstride[k - 2] == 0 && L <= ROW_CACHE)
        row_cache_open(&rc, L);
#endif
    Py_ssize_t e = start;
    while (e < stop) {
        Py_ssize_t n = L - col < stop - e ? L - col : stop - e;
        const char *sc_row = J->scales + poff * SCALE_SIZE[J->sk];
        const char *zp_row = J->zps ? J->zps + poff * ZP_SIZE[J->zk] : NULL;
#ifdef HAVE_FUSED
        if (fused && g == 1) {
            int sk = J->sk, zk = J->zk;
            if (rc.sc) {
                row_cache_fill(&rc, J, sc_row, zp_row, L, poff);
                sc_row = (const char *)rc.sc;
                zp_row = zp_row ? (const char *)rc.zp : NULL;
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
            if (own || (g == 1 && narrow_params)) {
                /* the groups this block touches (at most STAGE / 2 + 2 of them, g >= 2), or its
                   elements' params (g == 1: where kernels/native.py did not widen them) */
                Py_ssize_t g0 = c / g, count = (c + m - 1) / g - g0 + 1;
                if (J->sk == SK_F32) sc += g0;
                else { widen_range(sc_row + g0 * 2, sbuf, count, SCALE_WIDEN[J->sk]); sc = sbuf; }
                if (zp_row && J->zk == ZK_I32) zp += g0;
                else if (zp_row) { widen_range(zp_row + g0, zbuf, count, ZP_WIDEN[J->zk]); zp = zbuf; }
                c -= g0 * g;
            }
#ifdef HAVE_FUSED
            if (tables) {
                (level >= 2 ? table512 : table256)(J->src + e + j, J->out + (e + j) * J->out_size, sc, zp, c, m, g, J->src_kind, J->dst_kind,
                         J->zmode, J->stream);
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

static PyObject *py_level(PyObject *self, PyObject *unused) { return PyLong_FromLong(level); }

/* set_level(n): run at level n (0 to cpu_level) from now on; for tests of the lower levels'
   paths on a machine that has a higher one. */
static PyObject *py_set_level(PyObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > cpu_level) {
        PyErr_Format(PyExc_ValueError, "level %ld: this CPU has levels 0 to %d", n, cpu_level);
        return NULL;
    }
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
