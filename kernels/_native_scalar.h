/* dyndq's compiled kernel (_native.c): its arithmetic element by element, exactly as the
   module docstring of _native.c states it, and the plain loop built from it (segment),
   which every variant runs where no vector loop applies.  Included once, by _native.c. */
#pragma once

#include "_native_port.h"

#define MAX_DIMS 32

/* The kinds of every array the kernel reads or writes: defined here only.  kernels/native.py
   reads them from the module (KINDS, built by _native.c from these), never by position.

   src: integer codes, read as their values (int2/uint2 and int4/uint4 one a byte, the low bits,
   sign-extended for the signed ones, as ml_dtypes reads them; int16/uint16/int32 2 and 4 bytes
   an element, at any address); or SRC_TAB, one-byte codes of any other type (float8, float6,
   float4), each byte decoded through a table of 256 float32 values the caller builds once per
   dtype (kernels/native.py: ml_dtypes' own values, checked exact), so that every level reads the
   very values the table holds.  Float codes' zero points are zeros (ZP_FLOAT, below). */
enum { SRC_I8, SRC_U8, SRC_I4, SRC_U4, SRC_I2, SRC_U2, SRC_I16, SRC_U16, SRC_I32, SRC_TAB };
static const int SRC_SIZE[] = {1, 1, 1, 1, 1, 1, 2, 2, 4, 1};
enum { DST_F32, DST_F16, DST_BF16 };
/* zmode: no zero points; "narrow" (src - zp fits in int32 for every element: the caller knows
   from src's range and the zero points'); "wide" (any other: the difference in double, exact
   since |src - zp| < 2**33, then one rounding to float32, as the int64 one would round); "float"
   (SRC_TAB only: each zp is the float32 bits of a zero, +0 or -0, subtracted from the code's value
   in float32 as DequantizeLinear's x - x_zero_point is: a -0 code minus -0 is +0, every other code
   its own value; kernels/native.py passes them only where some are -0) */
enum { ZP_NONE, ZP_NARROW, ZP_WIDE, ZP_FLOAT };
/* |zp| up to this: src - zp fits in int32 for every src of 8 bits or fewer (|src| <= 255) */
#define NARROW_ZP ((1LL << 31) - 256)

#define INLINE DQ_INLINE

/* Typed reads of parameters that may sit at any address (a NumPy array need not be aligned):
   through memcpy, which compilers make one plain load. */
INLINE float read_f32(const void *p, Py_ssize_t i) { float f; memcpy(&f, (const char *)p + 4 * i, 4); return f; }
INLINE int32_t read_i32(const void *p, Py_ssize_t i) { int32_t v; memcpy(&v, (const char *)p + 4 * i, 4); return v; }
INLINE uint16_t read_u16(const void *p, Py_ssize_t i) { uint16_t v; memcpy(&v, (const char *)p + 2 * i, 2); return v; }
INLINE int16_t read_i16(const void *p, Py_ssize_t i) { int16_t v; memcpy(&v, (const char *)p + 2 * i, 2); return v; }

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

/* Element j of integer codes of kind src (not SRC_TAB) as its value */
INLINE int32_t load(const uint8_t *s, Py_ssize_t j, int src) {
    switch (src) {
    case SRC_I16: return read_i16(s, j);
    case SRC_U16: return read_u16(s, j);
    case SRC_I32: return read_i32(s, j);
    default: break;
    }
    uint8_t b = s[j];
    switch (src) {
    case SRC_I8: return (int8_t)b;
    case SRC_U8: return b;
    case SRC_I4: return (int32_t)(int8_t)(uint8_t)(b << 4) >> 4;
    case SRC_U4: return b & 15;
    case SRC_I2: return (int32_t)(int8_t)(uint8_t)(b << 6) >> 6;
    default: return b & 3;
    }
}

/* float32(src[j] - z), the one rounding of the exact difference (tab: SRC_TAB's 256 values; a
   float zero point z, +0 or -0 as float32 bits, subtracted in float32: exact, a NaN code's NaN kept) */
INLINE float diff(const uint8_t *s, Py_ssize_t j, int src, int zmode, int32_t z, const float *tab) {
    if (src == SRC_TAB) return zmode == ZP_FLOAT ? tab[s[j]] - bits_f32((uint32_t)z) : tab[s[j]];
    int32_t v = load(s, j, src);
    if (zmode == ZP_NONE) return (float)v;
    if (zmode == ZP_NARROW) return (float)(v - z);
    return (float)((double)v - (double)z); /* exact in double (|v - z| < 2**33), then one rounding */
}

/* The product d * c, d first: where both are NaN, d's NaN (x86 multiplies so, taking the first
   operand's; the oracle does).  A compiler may swap a multiply's operands, so where d can be a
   NaN (float codes: the table's NaNs, quiet) the result is d itself, chosen on its bits. */
INLINE float product(float d, float c, int src) {
    const float p = d * c;
    if (src != SRC_TAB) return p; /* (an integer difference is never a NaN) */
    const uint32_t db = f32_bits(d);
    return (db & 0x7FFFFFFFu) > 0x7F800000u ? d : p;
}

INLINE void store(void *o, Py_ssize_t j, int dst, float p) {
    switch (dst) {
    case DST_F32: ((float *)o)[j] = p; break;
    case DST_F16: ((uint16_t *)o)[j] = to_f16(p); break;
    default: ((uint16_t *)o)[j] = to_bf16(p); break;
    }
}

/* The parameters as the caller gives them: scales float32, float16, bfloat16 or float8_e8m0fnu
   (2**(e - 127); e = 0 the float32 subnormal 2**-127, e = 255 NaN, as ml_dtypes decodes it),
   zero points int32 or of 2, 4, 8 or 16 bits.  run_range widens what each block of STAGE elements needs into a small
   aligned buffer (widen_range, vectorized: a group's, or at level 0 each element's where
   kernels/native.py has not widened them), so no pass over all of them precedes the work
   and the loops below see aligned float32 / int32 only.  (The fused loops read them as given.) */
enum { SK_F32, SK_F16, SK_BF16, SK_E8M0 };
enum { ZK_I32, ZK_I8, ZK_U8, ZK_I4, ZK_U4, ZK_I2, ZK_U2, ZK_I16, ZK_U16 };
static const int SCALE_SIZE[] = {4, 2, 2, 1}, ZP_SIZE[] = {4, 1, 1, 1, 1, 1, 1, 2, 2};
/* each zero-point kind's values are read as load reads the src kind of the same dtype */
static const int ZP_SRC[] = {SRC_I32, SRC_I8, SRC_U8, SRC_I4, SRC_U4, SRC_I2, SRC_U2, SRC_I16, SRC_U16};
enum { W_F16, W_BF16, W_E8M0, W_I8, W_U8, W_I4, W_U4, W_I2, W_U2, W_I16, W_U16 }; /* widen_range's kinds */
static const int W_SIZE[] = {2, 2, 1, 1, 1, 1, 1, 1, 1, 2, 2};
static const int SCALE_WIDEN[] = {-1, W_F16, W_BF16, W_E8M0};
static const int ZP_WIDEN[] = {-1, W_I8, W_U8, W_I4, W_U4, W_I2, W_U2, W_I16, W_U16};

/* float8_e8m0fnu's byte as float32 bits: 2**(e - 127), exactly (e = 0: the subnormal 2**-127,
   0x00400000), NaN 0x7FC00000 for e = 255 (ml_dtypes' NaN) */
INLINE uint32_t e8m0_to_f32_bits(uint8_t e) {
    const uint32_t normal = (uint32_t)e << 23;
    return e == 0 ? 0x00400000u : e == 255 ? 0x7FC00000u : normal;
}

INLINE uint32_t f16_to_f32_bits(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3FFu;
    uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
    uint32_t special = sign | 0x7F800000u | (m << 13); /* Inf, NaN (payload kept, as NumPy does) */
    uint32_t sub = sign | f32_bits((float)m * 0x1p-24f); /* exact: m < 2**10 */
    uint32_t is_sub = 0u - (uint32_t)(e == 0), is_special = 0u - (uint32_t)(e == 31); /* masks: no branch */
    return (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
}

/* One run of n elements with one zp and one scale. */
INLINE void run_const(const uint8_t *s, void *o, float c, int32_t z, Py_ssize_t n, int src, int dst, int zmode,
                      const float *tab) {
    for (Py_ssize_t j = 0; j < n; j++)
        store(o, j, dst, product(diff(s, j, src, zmode, z, tab), c, src));
}

/* n elements from column `col` of a row whose params change every g columns (g == 1:
   at every element; g >= the row's length: never).  Every combination of the kinds is
   its own loop once inlined into `segment`. */
INLINE void seg(const uint8_t *s, void *o, const float *sc, const int32_t *zp, Py_ssize_t col, Py_ssize_t n,
                Py_ssize_t g, int src, int dst, int zmode, const float *tab) {
    if (g == 1) {
        sc += col;
        zp = zmode == ZP_NONE ? zp : zp + col;
        for (Py_ssize_t j = 0; j < n; j++)
            store(o, j, dst, product(diff(s, j, src, zmode, zmode == ZP_NONE ? 0 : zp[j], tab), sc[j], src));
        return;
    }
    Py_ssize_t gi = col / g, off = col % g, j = 0;
    const int out_size = dst == DST_F32 ? 4 : 2;
    while (j < n) {
        Py_ssize_t m = g - off < n - j ? g - off : n - j;
        const float c = sc[gi];
        const int32_t z = zmode == ZP_NONE ? 0 : zp[gi];
        char *oj = (char *)o + j * out_size;
        const uint8_t *sj = s + j * SRC_SIZE[src];
        /* the usual group sizes as constants: a loop of known length unrolls into a few
           vector instructions, where one of unknown length pays its set-up at every group */
        switch (m) {
        case 32: run_const(sj, oj, c, z, 32, src, dst, zmode, tab); break;
        case 64: run_const(sj, oj, c, z, 64, src, dst, zmode, tab); break;
        case 128: run_const(sj, oj, c, z, 128, src, dst, zmode, tab); break;
        default: run_const(sj, oj, c, z, m, src, dst, zmode, tab); break;
        }
        j += m;
        gi++;
        off = 0;
    }
}

#define SEG(SRC, DST, Z) seg(s, o, sc, zp, col, n, g, SRC, DST, Z, tab)
#define BY_ZP(SRC, DST) \
    (zmode == ZP_NONE ? SEG(SRC, DST, ZP_NONE) : zmode == ZP_NARROW ? SEG(SRC, DST, ZP_NARROW) : SEG(SRC, DST, ZP_WIDE))
#define BY_DST(SRC) \
    (dst == DST_F32 ? BY_ZP(SRC, DST_F32) : dst == DST_F16 ? BY_ZP(SRC, DST_F16) : BY_ZP(SRC, DST_BF16))
#define BY_DST_NO_ZP(SRC) /* (float codes: no zero point) */ \
    (dst == DST_F32   ? SEG(SRC, DST_F32, ZP_NONE)            \
     : dst == DST_F16 ? SEG(SRC, DST_F16, ZP_NONE)            \
                      : SEG(SRC, DST_BF16, ZP_NONE))
#define BY_DST_FLOAT_ZP /* (float codes with zero points of either sign) */ \
    (dst == DST_F32   ? SEG(SRC_TAB, DST_F32, ZP_FLOAT)                    \
     : dst == DST_F16 ? SEG(SRC_TAB, DST_F16, ZP_FLOAT)                    \
                      : SEG(SRC_TAB, DST_BF16, ZP_FLOAT))

#define BY_DST_NARROW(SRC) /* (no wide subtraction) */ \
    (dst == DST_F32 ? (zmode == ZP_NONE ? SEG(SRC, DST_F32, ZP_NONE) : SEG(SRC, DST_F32, ZP_NARROW)) \
     : dst == DST_F16 ? (zmode == ZP_NONE ? SEG(SRC, DST_F16, ZP_NONE) : SEG(SRC, DST_F16, ZP_NARROW)) \
     : (zmode == ZP_NONE ? SEG(SRC, DST_BF16, ZP_NONE) : SEG(SRC, DST_BF16, ZP_NARROW)))

/* s: the segment's first element (n of them, from column col); tab: SRC_TAB's values.  few: a
   constant, true where the caller takes the plain loop for 8- and 4-bit codes without the wide
   subtraction and for float codes with zero points only (the vector variants: runs takes the
   rest), so that no other is compiled in. */
INLINE void segment(const uint8_t *s, void *o, const float *sc, const int32_t *zp, Py_ssize_t col, Py_ssize_t n,
                    Py_ssize_t g, int src, int dst, int zmode, const float *tab, int few) {
    if (few) {
        switch (src) {
        case SRC_I8: BY_DST_NARROW(SRC_I8); break;
        case SRC_U8: BY_DST_NARROW(SRC_U8); break;
        case SRC_I4: BY_DST_NARROW(SRC_I4); break;
        case SRC_TAB: BY_DST_FLOAT_ZP; break;
        default: BY_DST_NARROW(SRC_U4); break;
        }
        return;
    }
    switch (src) {
    case SRC_I8: BY_DST(SRC_I8); break;
    case SRC_U8: BY_DST(SRC_U8); break;
    case SRC_I4: BY_DST(SRC_I4); break;
    case SRC_U4: BY_DST(SRC_U4); break;
    case SRC_I2: BY_DST(SRC_I2); break;
    case SRC_U2: BY_DST(SRC_U2); break;
    case SRC_I16: BY_DST(SRC_I16); break;
    case SRC_U16: BY_DST(SRC_U16); break;
    case SRC_I32: BY_DST(SRC_I32); break;
    default:
        if (zmode == ZP_FLOAT) BY_DST_FLOAT_ZP;
        else BY_DST_NO_ZP(SRC_TAB);
        break;
    }
}
