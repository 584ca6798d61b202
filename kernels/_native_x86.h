/* dyndq's compiled kernel (_native.c): the vector conversions of x86 CPUs with AVX2 and F16C
   or AVX-512 (float32 to float16 / bfloat16, bit for bit as _native_scalar.h's to_f16 and
   to_bf16), their non-temporal stores, and emit / emit512, which write the plain loop's
   staged products.  Included once, by _native.c, where _native_port.h defines DQ_X86. */
#pragma once

#define AVX2 DQ_AVX2
#define AVX512 DQ_AVX512

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


/* 16 products to float16 (the CPU's nearest-even conversion, NaN made 0x7E00: found among the
   float16 bits by a vector compare, off the port the conversion and the permutes crowd) or to
   bfloat16 (to_bf16's integer rounding, NaNs found by one compare into a mask). */
AVX512 INLINE __m256i half16(__m512 v, int dst) {
    if (dst == DST_F16) {
        const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                               _mm256_set1_epi16(0x7C00));
        return _mm256_ternarylogic_epi32(nan, h, _mm256_set1_epi16(0x7E00), 0xAC); /* nan ? 0x7E00 : h */
    }
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
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
