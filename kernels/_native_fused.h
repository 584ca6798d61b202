/* dyndq's compiled kernel (_native.c): the fused loops, AVX-512 (lanes512, table512, runs512)
   and AVX2 (lanes256, table256, runs256), which run_range takes where they apply.  Included
   once, by _native.c, after _native_x86.h. */
#pragma once

/* The fused loops of AVX-512 machines: the output written as it is computed, with no
   staging block between (emit needs one for its aligned non-temporal stores; these align
   their own vectors, doing the head and the tail with masked loads and stores).  Three
   forms, each chosen by run_range where it holds:

   * lanes512: 8- and 4-bit src, parameters that change at every element (g == 1), read as
     given (float16 through the CPU's exact conversion, bfloat16 by a shift, 4/8-bit zero
     points by sign or zero extension), so nothing is widened before the threads start;
     not for the wide subtraction;
   * table512: 4- and 2-bit src with parameters that hold for runs of g >= 16: src has 16
     (4) values, so a group's outputs are a table of 16, computed as one vector by the
     same arithmetic (hence the same bits) and looked up by each element's nibble with one
     permute (vpermw / vpermd), two or three where a vector spans groups; not for the wide
     subtraction;
   * runs512 (below): every other kind (int16/uint16/int32 and float codes, float8_e8m0fnu
     scales, 2- and 16-bit zero points, the wide subtraction), any g, the parameters widened
     a block at a time. */
enum { OUT_MASKED, OUT_PLAIN, OUT_STREAM };

/* The entry points below are compiled for AVX-512 whatever clone of run_range calls them,
   so the kinds are made constants here (a switch over every combination, as segment's)
   rather than in run_range, which GCC cannot inline them into. */

/* 16 bytes of src (lanes in k) as int32: any 1-byte integer kind */
AVX512 INLINE __m512i src16(const uint8_t *s, __mmask16 k, int full, int src) {
    const __m128i b = full ? _mm_loadu_si128((const __m128i *)s) : _mm_maskz_loadu_epi8(k, s);
    switch (src) {
    case SRC_I8: return _mm512_cvtepi8_epi32(b);
    case SRC_U8: return _mm512_cvtepu8_epi32(b);
    case SRC_I4: return _mm512_srai_epi32(_mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 28), 28);
    case SRC_U4: return _mm512_and_si512(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(15));
    case SRC_I2: return _mm512_srai_epi32(_mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 30), 30);
    default: return _mm512_and_si512(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(3));
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
    const int bits = src == SRC_I2 || src == SRC_U2 ? 2 : 4; /* 2-bit src: each nibble's low 2 bits */
    __m512i v = src == SRC_I4 || src == SRC_I2 ? _mm512_srai_epi32(_mm512_slli_epi32(nib, 32 - bits), 32 - bits)
                                               : _mm512_and_si512(nib, _mm512_set1_epi32((1 << bits) - 1));
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

/* table_body for 2- and 4-bit src, zmode ZP_NONE or ZP_NARROW */
AVX512 DQ_NOINLINE static void table512(const uint8_t *s, char *o, const float *sc, const int32_t *zp,
                                                      Py_ssize_t c, Py_ssize_t m, Py_ssize_t g, int src, int dst,
                                                      int zmode, int stream) {
    switch (src) {
    case SRC_I4: TABLE_DST(SRC_I4); break;
    case SRC_U4: TABLE_DST(SRC_U4); break;
    case SRC_I2: TABLE_DST(SRC_I2); break;
    default: TABLE_DST(SRC_U2); break;
    }
}
#undef TABLE
#undef TABLE_DST

/* How far ahead of its reads runs512 / runs256 ask for src (bytes): with a vector lookup between
   a read and its stores, the hardware's prefetcher fell behind (float8 codes to float16 took
   twice the time of int16 codes where src came from memory, the same with this). */
#define PREFETCH 1024

/* runs512: every src kind (the one-byte float codes through their table, int16/uint16/int32,
   2- to 8-bit integers), every zmode, parameters that change every g >= 1 elements, read as
   float32 / int32 (run_range widens each block's); 16 elements a step, each step's scales and
   zero points one vector (g == 1: loaded; else the group's, blended with the next group's
   from the lane where it starts, as table_step does), so the output is written in aligned
   steps whatever g is. */

/* 16 codes at element i (lanes in k) as float32 differences src - zp: exact, or (ZP_WIDE) the
   exact difference in double rounded once to float32; SRC_TAB: the table's values */
AVX512 INLINE __m512 diff16(const uint8_t *s, Py_ssize_t i, __mmask16 k, int full, int src, int zmode, __m512i z,
                            const float *tab) {
    if (src == SRC_TAB) {
        const __m128i b = full ? _mm_loadu_si128((const __m128i *)(s + i)) : _mm_maskz_loadu_epi8(k, s + i);
        const __m512i idx = _mm512_cvtepu8_epi32(b);
        /* The lanes a gather leaves are idx's, and its mask one the compiler cannot see is
           all ones: else it drops the source, and the gather waits for whatever its register
           last held (the previous step's output, a chain through every step: 1.5 times the
           time at level 1). */
        const __mmask16 all = _mm512_mask_cmpgt_epi32_mask(full ? 0xFFFF : k, idx, _mm512_set1_epi32(-1));
        return _mm512_mask_i32gather_ps(_mm512_castsi512_ps(idx), all, idx, tab, 4);
    }
    __m512i v;
    if (src == SRC_I16 || src == SRC_U16) {
        const __m256i h = full ? _mm256_loadu_si256((const __m256i *)(s + 2 * i))
                               : _mm256_maskz_loadu_epi16(k, s + 2 * i);
        v = src == SRC_I16 ? _mm512_cvtepi16_epi32(h) : _mm512_cvtepu16_epi32(h);
    } else if (src == SRC_I32) {
        v = full ? _mm512_loadu_si512(s + 4 * i) : _mm512_maskz_loadu_epi32(k, s + 4 * i);
    } else {
        v = src16(s + i, k, full, src);
    }
    if (zmode == ZP_NONE) return _mm512_cvtepi32_ps(v);
    if (zmode == ZP_NARROW) return _mm512_cvtepi32_ps(_mm512_sub_epi32(v, z));
    const __m512d lo = _mm512_sub_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(v)),
                                     _mm512_cvtepi32_pd(_mm512_castsi512_si256(z)));
    const __m512d hi = _mm512_sub_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(v, 1)),
                                     _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(z, 1)));
    const __m256 l = _mm512_cvtpd_ps(lo), h = _mm512_cvtpd_ps(hi);
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(l)), _mm256_castps_pd(h), 1));
}

/* The 32 one-byte float codes at s (lanes in k) as two vectors of 16 float32, looked up in the
   table's float16 values (T: 4 x 64 of them, each value exactly its float32 one: _native.c
   checks) by four two-register word permutes, the top two bits of each code choosing among
   their results, then widened exactly by vcvtph2ps: a quarter of a gather's cost. */
AVX512 INLINE void tab32(const uint8_t *s, __mmask32 k, int full, const __m512i *T, __m512 *d0, __m512 *d1) {
    const __m256i b = full ? _mm256_loadu_si256((const __m256i *)s) : _mm256_maskz_loadu_epi8(k, s);
    const __m512i idx = _mm512_cvtepu8_epi16(b);
    const __m512i r0 = _mm512_permutex2var_epi16(T[0], idx, T[1]), r1 = _mm512_permutex2var_epi16(T[2], idx, T[3]);
    const __m512i r2 = _mm512_permutex2var_epi16(T[4], idx, T[5]), r3 = _mm512_permutex2var_epi16(T[6], idx, T[7]);
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
    const __m512i r = _mm512_mask_mov_epi16(_mm512_mask_mov_epi16(r0, b6, r1), b7, _mm512_mask_mov_epi16(r2, b6, r3));
    *d0 = _mm512_cvtph_ps(_mm512_castsi512_si256(r));
    *d1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(r, 1));
}

/* 16 products d * c, a NaN d giving itself (see product: the compiler may swap the operands) */
AVX512 INLINE __m512 mul16(__m512 d, __m512 c, int src) {
    const __m512 p = _mm512_mul_ps(d, c);
    return src == SRC_TAB ? _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q), d) : p;
}

/* The scales and zero points of the 16 lanes from element at (k: those stored; whole: all 16).
   As in table_step, *gi is element at's group and *bnd the next group's first element (later
   groups every g), moved on to element at; g == 1: element at's params at sc[at], zp[at]. */
AVX512 INLINE void params16(const float *sc, const int32_t *zp, Py_ssize_t *gi, Py_ssize_t *bnd, Py_ssize_t g,
                            Py_ssize_t at, Py_ssize_t n, __mmask16 k, int whole, int zmode, __m512 *c, __m512i *z) {
    *z = _mm512_setzero_si512();
    if (g == 1) {
        *c = whole ? _mm512_loadu_ps(sc + at) : _mm512_maskz_loadu_ps(k, sc + at);
        if (zmode != ZP_NONE) *z = whole ? _mm512_loadu_si512(zp + at) : _mm512_maskz_loadu_epi32(k, zp + at);
        return;
    }
    while (*bnd <= at) { ++*gi; *bnd += g; }
    *c = _mm512_set1_ps(sc[*gi]);
    if (zmode != ZP_NONE) *z = _mm512_set1_epi32(zp[*gi]);
    Py_ssize_t t = *gi;
    for (Py_ssize_t b0 = *bnd; b0 < at + n; b0 += g) { /* the groups that start in these lanes */
        const __mmask16 next = (__mmask16)(0xFFFFu << (b0 - at));
        t++;
        *c = _mm512_mask_mov_ps(*c, next, _mm512_set1_ps(sc[t]));
        if (zmode != ZP_NONE) *z = _mm512_mask_mov_epi32(*z, next, _mm512_set1_epi32(zp[t]));
    }
}

/* count (<= 32) elements at i, as two halves of 16, of which the first `count` are stored (mode:
   for the whole step; a half with all its 16 lanes in a masked step is stored plainly); T: the
   table's float16 values (SRC_TAB where they are exact; half_tab says so, a constant) */
AVX512 INLINE void runs_step(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t *gi,
                             Py_ssize_t *bnd, Py_ssize_t g, Py_ssize_t i, Py_ssize_t count, int mode, int src, int dst,
                             int zmode, const float *tab, int half_tab, const __m512i *T) {
    const int full = mode != OUT_MASKED;
    const int whole1 = count >= 32, half1 = count > 16; /* the second half: all of it, some of it */
    const Py_ssize_t n0 = count < 16 ? count : 16, n1 = count - 16;
    const __mmask16 k0 = (__mmask16)(n0 == 16 ? 0xFFFF : (1u << n0) - 1);
    const __mmask16 k1 = (__mmask16)(whole1 ? 0xFFFF : half1 ? (1u << n1) - 1 : 0);
    __m512 d0, d1, c0, c1 = _mm512_setzero_ps();
    __m512i z0, z1 = _mm512_setzero_si512();
    params16(sc, zp, gi, bnd, g, i, n0, k0, n0 == 16, zmode, &c0, &z0);
    if (half1) params16(sc, zp, gi, bnd, g, i + 16, whole1 ? 16 : n1, k1, whole1, zmode, &c1, &z1);
    _mm_prefetch((const char *)s + i * SRC_SIZE[src] + PREFETCH, _MM_HINT_T0);
    if (half_tab) {
        tab32(s + i, (__mmask32)(full ? 0xFFFFFFFFu : (1ull << count) - 1), full, T, &d0, &d1);
    } else {
        d0 = diff16(s, i, k0, n0 == 16, src, zmode, z0, tab);
        d1 = half1 ? diff16(s, i + 16, k1, whole1, src, zmode, z1, tab) : _mm512_setzero_ps();
    }
    const __m512 p0 = mul16(d0, c0, src), p1 = mul16(d1, c1, src);
    if (full && dst != DST_F32) { /* 32 16-bit outputs: one 64-byte vector, stored at once */
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(half16(p0, dst)), half16(p1, dst), 1);
        if (mode == OUT_STREAM) stream64(o + i * 2, w);
        else _mm512_storeu_si512(o + i * 2, w);
        return;
    }
    const int size = dst == DST_F32 ? 4 : 2;
    put16(o + i * size, p0, k0, full ? mode : n0 == 16 ? OUT_PLAIN : OUT_MASKED, dst);
    if (half1) put16(o + (i + 16) * size, p1, k1, full ? mode : whole1 ? OUT_PLAIN : OUT_MASKED, dst);
}

/* m elements from column c of a row whose params change every g columns (sc[0], zp[0]: column
   0's; c < g); tab16: the table's float16 values where they are exact (else NULL: gathers) */
AVX512 INLINE void runs_body(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t c,
                             Py_ssize_t m, Py_ssize_t g, int src, int dst, int zmode, const float *tab,
                             const uint16_t *tab16, int stream, int half_tab) {
    const int size = dst == DST_F32 ? 4 : 2;
    __m512i T[8];
    if (half_tab)
        for (int q = 0; q < 8; q++) T[q] = _mm512_loadu_si512(tab16 + 32 * q);
    if (g == 1) sc += c, zp = zp ? zp + c : zp; /* (c is 0) */
    Py_ssize_t gi = 0, bnd = g - c; /* element i's group, the next group's first element */
    Py_ssize_t i = stream ? head_of(o, m, size) : 0;
    stream = stream && (uintptr_t)o % size == 0;
#define STEP(I, COUNT, MODE) runs_step(s, o, sc, zp, &gi, &bnd, g, I, COUNT, MODE, src, dst, zmode, tab, half_tab, T)
    if (i) STEP(0, i, OUT_MASKED);
    for (; i + 32 <= m; i += 32)
        STEP(i, 32, stream ? OUT_STREAM : OUT_PLAIN);
    if (i < m) STEP(i, m - i, OUT_MASKED);
#undef STEP
}

#define RUNS(SRC, DST, Z) RUNS_BODY(s, o, sc, zp, c, m, g, SRC, DST, Z, tab, tab16, stream, 0)
#define RUNS_H(DST, H) RUNS_BODY(s, o, sc, zp, c, m, g, SRC_TAB, DST, ZP_NONE, tab, tab16, stream, H)
#define RUNS_Z(SRC, DST) \
    (zmode == ZP_NONE     ? RUNS(SRC, DST, ZP_NONE)   \
     : zmode == ZP_NARROW ? RUNS(SRC, DST, ZP_NARROW) \
                          : RUNS(SRC, DST, ZP_WIDE))
#define RUNS_DST(SRC) \
    (dst == DST_F32 ? RUNS_Z(SRC, DST_F32) : dst == DST_F16 ? RUNS_Z(SRC, DST_F16) : RUNS_Z(SRC, DST_BF16))
#define RUNS_BY_SRC                                                                                            \
    switch (src) {                                                                                             \
    case SRC_I8: RUNS_DST(SRC_I8); break;                                                                      \
    case SRC_U8: RUNS_DST(SRC_U8); break;                                                                      \
    case SRC_I4: RUNS_DST(SRC_I4); break;                                                                      \
    case SRC_U4: RUNS_DST(SRC_U4); break;                                                                      \
    case SRC_I2: RUNS_DST(SRC_I2); break;                                                                      \
    case SRC_U2: RUNS_DST(SRC_U2); break;                                                                      \
    case SRC_I16: RUNS_DST(SRC_I16); break;                                                                    \
    case SRC_U16: RUNS_DST(SRC_U16); break;                                                                    \
    case SRC_I32: RUNS_DST(SRC_I32); break;                                                                    \
    default: /* float codes: no zero point; their float16 values where exact (RUNS_H) */                   \
        if (tab16)                                                                                             \
            dst == DST_F32 ? RUNS_H(DST_F32, 1) : dst == DST_F16 ? RUNS_H(DST_F16, 1) : RUNS_H(DST_BF16, 1);   \
        else                                                                                                   \
            dst == DST_F32 ? RUNS_H(DST_F32, 0) : dst == DST_F16 ? RUNS_H(DST_F16, 0) : RUNS_H(DST_BF16, 0);   \
        break;                                                                                                 \
    }

#define RUNS_BODY runs_body
AVX512 DQ_NOINLINE static void runs512(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t c,
                                       Py_ssize_t m, Py_ssize_t g, int src, int dst, int zmode, const float *tab,
                                       const uint16_t *tab16, int stream) {
    RUNS_BY_SRC;
}
#undef RUNS_BODY

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
    case SRC_U4: return _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(15));
    case SRC_I2: return _mm256_srai_epi32(_mm256_slli_epi32(_mm256_cvtepu8_epi32(b), 30), 30);
    default: return _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(3));
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
    if (src == SRC_I2 || src == SRC_U2) { /* each nibble's low 2 bits: 0 1 2 3 0 1 2 3 ..., or 0 1 -2 -1 ... */
        const int sh = src == SRC_I2 ? 30 : 0;
        const __m256i two = _mm256_set1_epi32(3);
        v0 = sh ? _mm256_srai_epi32(_mm256_slli_epi32(v0, sh), sh) : _mm256_and_si256(v0, two);
        v1 = sh ? _mm256_srai_epi32(_mm256_slli_epi32(v1, sh), sh) : _mm256_and_si256(v1, two);
    }
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
    switch (src) {
    case SRC_I4: TABLE_DST(SRC_I4); break;
    case SRC_U4: TABLE_DST(SRC_U4); break;
    case SRC_I2: TABLE_DST(SRC_I2); break;
    default: TABLE_DST(SRC_U2); break;
    }
#undef TABLE
#undef TABLE_DST
}

/* runs256: runs512's AVX2 twin, 16 elements a step (two vectors of 8); the head and the tail
   element by element, with the same arithmetic. */

/* 8 codes at element i as float32 differences (diff16's twin) */
AVX2 INLINE __m256 diff8(const uint8_t *s, Py_ssize_t i, int src, int zmode, __m256i z, const float *tab) {
    if (src == SRC_TAB) { /* (gathered over idx itself, with a mask the compiler cannot see: see diff16) */
        const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + i)));
        const __m256i all = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(-1));
        return _mm256_mask_i32gather_ps(_mm256_castsi256_ps(idx), tab, idx, _mm256_castsi256_ps(all), 4);
    }
    __m256i v;
    if (src == SRC_I16 || src == SRC_U16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(s + 2 * i));
        v = src == SRC_I16 ? _mm256_cvtepi16_epi32(h) : _mm256_cvtepu16_epi32(h);
    } else if (src == SRC_I32) {
        v = _mm256_loadu_si256((const __m256i *)(s + 4 * i));
    } else {
        v = src8(s + i, src);
    }
    if (zmode == ZP_NONE) return _mm256_cvtepi32_ps(v);
    if (zmode == ZP_NARROW) return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, z));
    const __m256d lo = _mm256_sub_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(v)),
                                     _mm256_cvtepi32_pd(_mm256_castsi256_si128(z)));
    const __m256d hi = _mm256_sub_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(v, 1)),
                                     _mm256_cvtepi32_pd(_mm256_extracti128_si256(z, 1)));
    return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

/* 8 products d * c, a NaN d giving itself (mul16's twin) */
AVX2 INLINE __m256 mul8(__m256 d, __m256 c, int src) {
    const __m256 p = _mm256_mul_ps(d, c);
    return src == SRC_TAB ? _mm256_blendv_ps(p, d, _mm256_cmp_ps(d, d, _CMP_UNORD_Q)) : p;
}

/* the 8 lanes' scales and zero points from element i (see runs_step) */
AVX2 INLINE void params8(const float *sc, const int32_t *zp, Py_ssize_t gi, Py_ssize_t bnd, Py_ssize_t g,
                         Py_ssize_t i, int zmode, __m256 *c, __m256i *z) {
    if (g == 1) {
        *c = _mm256_loadu_ps(sc + i);
        *z = zmode == ZP_NONE ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)(zp + i));
        return;
    }
    *c = _mm256_set1_ps(sc[gi]);
    *z = _mm256_set1_epi32(zmode == ZP_NONE ? 0 : zp[gi]);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (Py_ssize_t b0 = bnd; b0 < i + 8; b0 += g) {
        const __m256i next = _mm256_cmpgt_epi32(iota, _mm256_set1_epi32((int)(b0 - i - 1)));
        gi++;
        *c = _mm256_blendv_ps(*c, _mm256_set1_ps(sc[gi]), _mm256_castsi256_ps(next));
        if (zmode != ZP_NONE) *z = _mm256_blendv_epi8(*z, _mm256_set1_epi32(zp[gi]), next);
    }
}

AVX2 INLINE void runs_body256(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t c,
                              Py_ssize_t m, Py_ssize_t g, int src, int dst, int zmode, const float *tab,
                              const uint16_t *tab16, int stream, int half_tab) {
    (void)tab16, (void)half_tab; /* (AVX2: gathers from the float32 table) */
    const int size = dst == DST_F32 ? 4 : 2;
    const Py_ssize_t h = stream ? head_of(o, m, size) : 0;
    stream = stream && (uintptr_t)o % size == 0;
    Py_ssize_t gi = 0, bnd = g - c, i = 0; /* as in runs_body */
    if (g == 1) sc += c, zp = zp ? zp + c : zp; /* (c is 0) the params of element i at sc[i], zp[i] */
    for (;; i++) { /* the head, one by one, then 16 at a time, then the tail */
        if (g == 1) gi = i;
        else while (bnd <= i) { gi++; bnd += g; }
        if (i >= m) break;
        if (i >= h && i + 16 <= m) {
            _mm_prefetch((const char *)s + i * SRC_SIZE[src] + PREFETCH, _MM_HINT_T0);
            __m256 c0, c1;
            __m256i z0, z1;
            params8(sc, zp, gi, bnd, g, i, zmode, &c0, &z0);
            Py_ssize_t gi1 = gi, bnd1 = bnd;
            while (g > 1 && bnd1 <= i + 8) { gi1++; bnd1 += g; }
            params8(sc, zp, gi1, bnd1, g, i + 8, zmode, &c1, &z1);
            const __m256 p0 = mul8(diff8(s, i, src, zmode, z0, tab), c0, src);
            const __m256 p1 = mul8(diff8(s, i + 8, src, zmode, z1, tab), c1, src);
            if (dst == DST_F32) {
                store32(o + i * 4, _mm256_castps_si256(p0), stream);
                store32(o + i * 4 + 32, _mm256_castps_si256(p1), stream);
            } else {
                store32(o + i * 2, halves16(p0, p1, dst), stream);
            }
            i += 15;
        } else {
            store(o, i, dst, product(diff(s, i, src, zmode, zmode == ZP_NONE ? 0 : zp[gi], tab), sc[gi], src));
        }
    }
}

#define RUNS_BODY runs_body256
AVX2 DQ_NOINLINE static void runs256(const uint8_t *s, char *o, const float *sc, const int32_t *zp, Py_ssize_t c,
                                     Py_ssize_t m, Py_ssize_t g, int src, int dst, int zmode, const float *tab,
                                     const uint16_t *tab16, int stream) {
    RUNS_BY_SRC;
}
#undef RUNS_BODY
