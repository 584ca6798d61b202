/* dyndq's compiled kernel: the hot loops of `dyndq quantize`'s rtn (dyndq/quantization/rtn.py
   and numerics.py say the rules; their NumPy paths give the same codes, scales and zero points).

   rtn_levels_loop: the levels of ONNX Runtime's MatMul RTN for rows of groups,
     out[i] = clamp(roundf(g[i] * reciprocal[i / group] + zero[i / group]), 0, qmax).
   rtn_tile: ONNX Runtime's whole RTN, either rule (float32 weight, float32 scales) on a tile of a
     weight viewed as [outer, length, inner] and quantized along `length`, read in place: per
     group and column its min and max, scale, zero point and levels, then each value as our
     kernel dequantizes it, whether the tile is final (TileSums.done), and the report's error sums.  Where NumPy
     copied the tile to rows of groups (a transposing copy), made a pass per step, and summed
     in float64 copies, this reads the tile's rows as they lie, COLS columns at a time (the
     column loops vectorize: no step depends on another column), and writes the levels in the
     weight's own layout.

   Every step rounds to float32 as ONNX Runtime's C++ does (-ffp-contract=off: no fused
   multiply-add); no libm: x >= 0.5 rounds half away as trunc(x) + (x - trunc(x) >= 0.5), the
   fraction exact. */
#pragma once

#include <float.h>
#include <math.h>
#include <stdint.h>

/* The two rules (dyndq/quantization/rtn.py): "matmul" (ONNX Runtime's C++ MlasQuantizeBlockwise:
   levels against the scale's reciprocal, rounded half away) and "gather" (its NumPy
   quantize_ndarray: levels by division, rounded half to even, an all-zero group at half). */
enum { RULE_MATMUL = 0, RULE_GATHER = 1 };

/* clamp(roundf(x), 0, qmax) as a level; a NaN (no comparison holds for it) and x < 0.5 give 0 */
DQ_INLINE uint8_t rtn_level(float x, float qmax) {
    if (x >= qmax) return (uint8_t)qmax;
    if (x >= 0.5f) {
        const int whole = (int)x; /* (0.5 <= x < 256: the cast is defined) */
        return (uint8_t)(whole + (x - (float)whole >= 0.5f));
    }
    return 0;
}

/* x rounded to the nearest integer, ties to even (NumPy's round), for |x| < 2^22: adding and
   taking back 1.5 * 2^23 leaves no fraction bits, and the addition rounds as the FPU does,
   to nearest even (no libm; -ffp-contract=off and no -ffast-math keep both steps) */
DQ_INLINE float round_even(float x) {
    const float shift = 12582912.0f;
    return (x + shift) - shift;
}

/* clip(round_even(x), 0, qmax) as a level; a NaN gives 0 */
DQ_INLINE uint8_t even_level(float x, float qmax) {
    if (!(x > 0.5f)) return 0;
    if (x >= qmax) return (uint8_t)qmax;
    return (uint8_t)(int)round_even(x);
}

/* clip(round_even(x), -half, half - 1) + half (a symmetric level); a NaN gives 0 */
DQ_INLINE uint8_t even_signed_level(float x, float half) {
    if (!(x > -half)) return 0;
    if (x >= half - 1.0f) return (uint8_t)(2.0f * half - 1.0f);
    return (uint8_t)((int)round_even(x) + (int)half);
}

static void rtn_levels_loop(const float *g, const float *rec, const float *zero, uint8_t *out,
                            Py_ssize_t groups, Py_ssize_t group, float qmax) {
    for (Py_ssize_t i = 0; i < groups; i++) {
        const float r = rec[i], z = zero[i];
        const float *gi = g + i * group;
        uint8_t *oi = out + i * group;
        for (Py_ssize_t j = 0; j < group; j++) oi[j] = rtn_level(gi[j] * r + z, qmax);
    }
}

/* The error sums of a tile (ErrorStats in numerics.py): per column while the tile is read,
   then added column by column in order, so a tile's sums do not depend on the thread. */
typedef struct {
    double sq_error, sq_weight, sq_dequantized, dot, max_abs;
    /* the tile is final: every value its levels dequantize to (padding included) is finite, and
       no group of zeros holds a -0 where NumPy's rule would take the scale's sign from it (its
       min and max of equal zeros follow its own vector order); else NumPy's path redoes it */
    int done;
} TileSums;

#define COLS 256 /* columns of a tile taken at once: their per-column state stays in L1 */

/* One group (rows [r0, r0 + rows) of the weight, `padded` rows in the codes) of columns
   [n0, n0 + cols) of outer row o; w, levels: that outer row's [length|padded, inner];
   scale, zero: the group's row of [n_groups, inner]. */
static void rtn_group(const float *w, uint8_t *levels, float *scale_out, uint8_t *zero_out, Py_ssize_t inner,
                      Py_ssize_t r0, Py_ssize_t rows, Py_ssize_t padded, Py_ssize_t n0, Py_ssize_t cols, float qmax,
                      float half, int symmetric, int rule, double acc[5][COLS], int *done) {
    float lo[COLS], hi[COLS], scale[COLS], rec[COLS], zero[COLS];
    const float *first = w + r0 * inner + n0;
    if (symmetric) { /* the group's own min and max */
        for (Py_ssize_t n = 0; n < cols; n++) lo[n] = hi[n] = first[n];
    } else { /* min(min(group), 0) and max(max(group), 0) */
        for (Py_ssize_t n = 0; n < cols; n++) lo[n] = hi[n] = 0.0f;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *row = w + (r0 + r) * inner + n0;
        for (Py_ssize_t n = 0; n < cols; n++) {
            lo[n] = row[n] < lo[n] ? row[n] : lo[n];
            hi[n] = row[n] > hi[n] ? row[n] : hi[n];
        }
    }
    for (Py_ssize_t n = 0; n < cols; n++) {
        float s, z;
        if (symmetric) {
            /* the larger side, signed (a tie takes the min); under the matmul rule a group of
               zeros takes its first element, sign and all */
            float m = fabsf(hi[n]) > fabsf(lo[n]) ? hi[n] : lo[n];
            if (m == 0.0f && rule == RULE_MATMUL) m = first[n];
            s = rule == RULE_MATMUL ? -m / half : m / -half;
            z = half;
        } else {
            s = (hi[n] - lo[n]) / qmax;
            if (isinf(s)) s = (float)(((double)hi[n] - (double)lo[n]) / (double)qmax); /* (rtn.range_scale) */
            if (rule == RULE_MATMUL)
                z = (float)rtn_level(s != 0.0f ? 0.0f - lo[n] / s : lo[n], qmax);
            else
                z = s != 0.0f ? (float)even_level(-lo[n] / s, qmax) : half;
        }
        if (s == 0.0f && !(symmetric && rule == RULE_MATMUL)) { /* (a group of zeros: see TileSums.done) */
            for (Py_ssize_t r = 0; r < rows; r++)
                if (signbit(w[(r0 + r) * inner + n0 + n])) *done = 0;
        }
        scale[n] = s;
        zero[n] = z;
        rec[n] = s != 0.0f ? 1.0f / s : 0.0f;
        scale_out[n0 + n] = s;
        zero_out[n0 + n] = (uint8_t)z;
    }
    int bad = 0;
    for (Py_ssize_t r = 0; r < padded; r++) {
        uint8_t *out = levels + (r0 + r) * inner + n0;
        if (r >= rows) { /* padding: level 0 (the bytes ONNX Runtime holds there), its value checked */
            for (Py_ssize_t n = 0; n < cols; n++) {
                const float v = (0.0f - zero[n]) * scale[n];
                out[n] = 0;
                bad |= !(fabsf(v) <= FLT_MAX);
            }
            continue;
        }
        const float *row = w + (r0 + r) * inner + n0;
        if (rule == RULE_MATMUL) { /* (each loop alone, for the compiler to vectorize it) */
            for (Py_ssize_t n = 0; n < cols; n++) out[n] = rtn_level(row[n] * rec[n] + zero[n], qmax);
        } else if (!symmetric) {
            for (Py_ssize_t n = 0; n < cols; n++)
                out[n] = scale[n] != 0.0f ? even_level(row[n] / scale[n] + zero[n], qmax) : (uint8_t)half;
        } else {
            for (Py_ssize_t n = 0; n < cols; n++)
                out[n] = scale[n] != 0.0f ? even_signed_level(row[n] / scale[n], half) : (uint8_t)half;
        }
        for (Py_ssize_t n = 0; n < cols; n++) {
            const uint8_t level = out[n];
            /* the value our kernel gives: the exact integer difference as float32, times the scale */
            const float v = (float)((int)level - (int)zero[n]) * scale[n];
            bad |= !(fabsf(v) <= FLT_MAX);
            const double x = row[n], d = x - (double)v;
            acc[0][n] += d * d;
            acc[1][n] += x * x;
            acc[2][n] += (double)v * (double)v;
            acc[3][n] += x * (double)v;
            const double a = fabs(d);
            acc[4][n] = a <= acc[4][n] ? acc[4][n] : a; /* (a NaN stays) */
        }
    }
    if (bad) *done = 0;
}

/* The tile [o0, o1) x [k0, k1) x [n0, n1) of w [outer, length, inner] (k0 a whole number of
   groups; k1 the end of a group or of the axis), its levels into levels [outer, padded, inner]
   (the last group padded), scales and zeros into [outer, n_groups, inner]. */
static TileSums rtn_tile(const float *w, uint8_t *levels, float *scales, uint8_t *zeros, Py_ssize_t length,
                         Py_ssize_t padded, Py_ssize_t inner, Py_ssize_t group, float qmax, int symmetric, int rule,
                         Py_ssize_t o0, Py_ssize_t o1, Py_ssize_t k0, Py_ssize_t k1, Py_ssize_t n0, Py_ssize_t n1) {
    TileSums t = {0.0, 0.0, 0.0, 0.0, 0.0, 1};
    const Py_ssize_t n_groups = padded / group;
    const float half = (float)(((int)qmax + 1) / 2);
    double acc[5][COLS]; /* per column: the four sums, the largest |difference| */
    for (Py_ssize_t c0 = n0; c0 < n1; c0 += COLS) {
        const Py_ssize_t cols = n1 - c0 < COLS ? n1 - c0 : COLS;
        for (int s = 0; s < 5; s++)
            for (Py_ssize_t n = 0; n < cols; n++) acc[s][n] = 0.0;
        for (Py_ssize_t o = o0; o < o1; o++) {
            const float *wo = w + o * length * inner;
            uint8_t *lo = levels + o * padded * inner;
            for (Py_ssize_t r0 = k0; r0 < k1; r0 += group) {
                const Py_ssize_t g = r0 / group, rows = length - r0 < group ? length - r0 : group;
                rtn_group(wo, lo, scales + (o * n_groups + g) * inner, zeros + (o * n_groups + g) * inner, inner, r0,
                          rows, group, c0, cols, qmax, half, symmetric, rule, acc, &t.done);
            }
        }
        for (Py_ssize_t n = 0; n < cols; n++) {
            t.sq_error += acc[0][n];
            t.sq_weight += acc[1][n];
            t.sq_dequantized += acc[2][n];
            t.dot += acc[3][n];
            t.max_abs = acc[4][n] <= t.max_abs ? t.max_abs : acc[4][n];
        }
    }
    return t;
}
