/* dyndq's compiled kernel (_native.c): the fused loops, AVX-512 (lanes512, table512) and
   AVX2 (lanes256, table256), which run_range takes where they apply.  Included once, by
   _native.c, after _native_x86.h. */
#pragma once

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

/* A 1-byte zero-point kind's bits (keep) and its sign bit (sign; 0 for the unsigned kinds):
   ((b & keep) ^ sign) - sign is the value, sign-extended where it has a sign. */
INLINE int32_t zp_keep(int zp_kind) { return zp_kind == ZK_I4 || zp_kind == ZK_U4 ? 0x0F : 0xFF; }
INLINE int32_t zp_sign(int zp_kind) { return zp_kind == ZK_I4 ? 0x08 : zp_kind == ZK_I8 ? 0x80 : 0; }

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

/* Elements before the first 16-byte boundary of o, where streamed stores (16 bytes each)
   may start (none for an o not element-aligned, which is then written without streaming),
   at most n. */
INLINE Py_ssize_t head_of(const char *o, Py_ssize_t n, int size) {
    if ((uintptr_t)o % size) return 0;
    Py_ssize_t h = (Py_ssize_t)((16 - (uintptr_t)o % 16) % 16) / size;
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
    const __m512i keep = _mm512_set1_epi32(zp_keep(zp_kind)), sign = _mm512_set1_epi32(zp_sign(zp_kind));
    Py_ssize_t i = 0, h = stream ? head_of(o, n, size) : 0;
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
    Py_ssize_t i = stream ? head_of(o, m, size) : 0;
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
AVX512 DQ_NOINLINE static void lanes512(const uint8_t *s, char *o, const char *sc, const char *zp,
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
AVX512 DQ_NOINLINE static void table512(const uint8_t *s, char *o, const float *sc, const int32_t *zp,
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

/* one element of lanes256: scale and zero point read at i, as product8 reads 8 (at any address) */
INLINE void lane_one(const uint8_t *s, char *o, const char *sc, const char *zp, Py_ssize_t i, int src, int dst,
                     int zmode, int sk, int zp_kind) {
    const float c = sk == SK_F32 ? read_f32(sc, i)
                    : sk == SK_F16 ? bits_f32(f16_to_f32_bits(read_u16(sc, i))) : bits_f32((uint32_t)read_u16(sc, i) << 16);
    const int32_t z = zmode == ZP_NONE ? 0
                      : zp_kind == ZK_I32 ? read_i32(zp, i)
                                          : load((const uint8_t *)zp, i, ZP_SRC[zp_kind]);
    store(o, i, dst, diff(s, i, src, zmode, z, NULL) * c);
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
    const __m256i keep = _mm256_set1_epi32(zp_keep(zp_kind)), sign = _mm256_set1_epi32(zp_sign(zp_kind));
    Py_ssize_t i = 0, h = stream ? head_of(o, n, size) : 0;
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
    const Py_ssize_t h = stream ? head_of(o, m, 2) : 0;
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
AVX2 DQ_NOINLINE static void lanes256(const uint8_t *s, char *o, const char *sc, const char *zp,
                                                    Py_ssize_t n, int src, int dst, int zmode, int sk, int zk,
                                                    int stream) {
    LANES_BY_SRC;
}
#undef BODY

AVX2 DQ_NOINLINE static void table256(const uint8_t *s, char *o, const float *sc, const int32_t *zp,
                                                    Py_ssize_t c, Py_ssize_t m, Py_ssize_t g, int src, int dst,
                                                    int zmode, int stream) {
#define TABLE(SRC, DST, Z) table_body256(s, o, sc, zp, c, m, g, SRC, DST, Z, stream)
#define TABLE_DST(SRC) (dst == DST_F16 ? TABLE_Z(SRC, DST_F16) : TABLE_Z(SRC, DST_BF16))
    if (src == SRC_I4) TABLE_DST(SRC_I4);
    else TABLE_DST(SRC_U4);
#undef TABLE
#undef TABLE_DST
}
