/* dyndq's compiled kernel: one variant of its entries (run_range, widen_range, narrow_range),
   compiled for one target.  _native.c includes this file once per variant, with

     VARIANT         the suffix of the variant's names (scalar, avx2, avx512)
     VARIANT_LEVEL   0, 1 or 2: which loops it may call (0: the plain loop alone; 1: AVX2 and
                     F16C's emit and fused loops; 2: AVX-512's)
     VARIANT_TARGET  what the compiler may use in it (DQ_AVX2, DQ_AVX512, or nothing)

   and puts each variant's functions in its table of entries (ONNX Runtime's MLAS way: every
   entry assigned its portable form first, then overridden per CPU feature in one place).
   The plain loop (segment, from _native_scalar.h) is inlined into each variant, so each
   level's copy of it is vectorized for that level's target and for no other: what a CPU
   without AVX2 runs is what the scalar variant was compiled to. */

#define DQ_CAT_(a, b) a##_##b
#define DQ_CAT(a, b) DQ_CAT_(a, b)
#define V(name) DQ_CAT(name, VARIANT)

#if VARIANT_LEVEL == 2
#define V_EMIT emit512
#define V_LANES lanes512
#define V_TABLE table512
#define V_RUNS runs512
#elif VARIANT_LEVEL == 1
#define V_EMIT emit
#define V_LANES lanes256
#define V_TABLE table256
#define V_RUNS runs256
#endif

/* float16 / bfloat16 / float8_e8m0fnu scales to float32, zero points of 2 to 16 bits to int32, n
   of them (as NumPy's and ml_dtypes' casts do, bit for bit; `in` at any address, `out` aligned). */
VARIANT_TARGET static void V(widen_range)(const void *in, void *out, Py_ssize_t n, int kind) {
    const uint8_t *b = in;
    uint32_t *f = out;
    int32_t *z = out;
#define WIDEN_ZP(SRC) for (Py_ssize_t i = 0; i < n; i++) z[i] = load(b, i, SRC)
    switch (kind) {
    case W_F16: for (Py_ssize_t i = 0; i < n; i++) f[i] = f16_to_f32_bits(read_u16(in, i)); break;
    case W_BF16: for (Py_ssize_t i = 0; i < n; i++) f[i] = (uint32_t)read_u16(in, i) << 16; break;
    case W_E8M0: for (Py_ssize_t i = 0; i < n; i++) f[i] = e8m0_to_f32_bits(b[i]); break;
    case W_I8: WIDEN_ZP(SRC_I8); break;
    case W_U8: WIDEN_ZP(SRC_U8); break;
    case W_I4: WIDEN_ZP(SRC_I4); break;
    case W_U4: WIDEN_ZP(SRC_U4); break;
    case W_I2: WIDEN_ZP(SRC_I2); break;
    case W_U2: WIDEN_ZP(SRC_U2); break;
    case W_I16: WIDEN_ZP(SRC_I16); break;
    default: WIDEN_ZP(SRC_U16); break;
    }
#undef WIDEN_ZP
}

/* float32 -> float16 / bfloat16 bits, as this variant's loops round (for the tests of the roundings) */
VARIANT_TARGET static void V(narrow_range)(const float *f, uint16_t *u, Py_ssize_t n, int dst) {
#if VARIANT_LEVEL >= 1
    V_EMIT(f, (char *)u, n, dst, 0);
#else
    if (dst == DST_F16)
        for (Py_ssize_t i = 0; i < n; i++) u[i] = to_f16(f[i]);
    else
        for (Py_ssize_t i = 0; i < n; i++) u[i] = to_bf16(f[i]);
#endif
}

/* Params [p0, p0 + count) of a row as aligned float32 / int32 in *sc / *zp: the row itself where
   it holds them so, else widened (or copied, when not aligned) into sbuf / zbuf (zbuf unused
   without zero points). */
VARIANT_TARGET static inline void V(widened)(const Job *J, const char *sc_row, const char *zp_row, Py_ssize_t p0,
                                             Py_ssize_t count, float *sbuf, int32_t *zbuf, const float **sc,
                                             const int32_t **zp) {
    if (J->sk == SK_F32 && (uintptr_t)sc_row % 4 == 0) *sc = (const float *)sc_row + p0;
    else if (J->sk == SK_F32) { memcpy(sbuf, sc_row + 4 * p0, 4 * count); *sc = sbuf; }
    else { V(widen_range)(sc_row + p0 * SCALE_SIZE[J->sk], sbuf, count, SCALE_WIDEN[J->sk]); *sc = sbuf; }
    if (!zp_row) *zp = NULL;
    else if (J->zk == ZK_I32 && (uintptr_t)zp_row % 4 == 0) *zp = (const int32_t *)zp_row + p0;
    else if (J->zk == ZK_I32) { memcpy(zbuf, zp_row + 4 * p0, 4 * count); *zp = zbuf; }
    else { V(widen_range)(zp_row + p0 * ZP_SIZE[J->zk], zbuf, count, ZP_WIDEN[J->zk]); *zp = zbuf; }
}

#if VARIANT_LEVEL >= 1
/* A row of params as float32 / int32 (see run_range), for the row at poff. */
static void V(row_cache_open)(RowCache *rc, const Job *J, Py_ssize_t L) {
    const int wide_sc = J->sk != SK_F32, wide_zp = J->zps && J->zk != ZK_I32;
    rc->sbuf = wide_sc ? malloc((size_t)L * sizeof(float)) : NULL;
    rc->zbuf = wide_zp ? malloc((size_t)L * sizeof(int32_t)) : NULL;
    rc->on = (!wide_sc || rc->sbuf) && (!wide_zp || rc->zbuf);
}

VARIANT_TARGET static void V(row_cache_fill)(RowCache *rc, const Job *J, const char *sc_row, const char *zp_row,
                                             Py_ssize_t L, Py_ssize_t poff) {
    if (rc->poff == poff) return;
    V(widened)(J, sc_row, zp_row, 0, L, rc->sbuf, rc->zbuf, &rc->sc, &rc->zp);
    rc->poff = poff;
}
#endif

/* Elements [start, stop) of the view, row by row (a row: the innermost dim, or the two
   innermost when groups of g along the last dim vary along the one before), keeping
   the index and the params' offset as counters rather than dividing at every row. */
VARIANT_TARGET static void V(run_range)(const Job *J, Py_ssize_t start, Py_ssize_t stop) {
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
#if VARIANT_LEVEL >= 1
    const int narrow_params = J->sk != SK_F32 || (J->zps && J->zk != ZK_I32); /* to widen */
    /* Staged: the plain loop's products written by emit, 8 (16) at a time, where streaming or a
       float16 rounding makes that pay. */
    const int staged = J->stream || J->dst_kind == DST_F16;
    /* the fused loops: lanes (params at every element, read as given: the kinds it knows),
       table (2- and 4-bit src; 16-bit outputs only at level 1), runs (the others: any kind, any
       g, params widened a block at a time; float codes with zero points, which hold a -0 where
       kernels/native.py passes them, take the plain loop) */
    const int lanes = g == 1 && J->zmode != ZP_WIDE && J->src_kind <= SRC_U4 && J->sk <= SK_BF16 &&
                      J->zk <= ZK_U4;
    const int tables = J->zmode != ZP_WIDE && g >= 16 && J->src_kind <= SRC_U2 && J->src_kind >= SRC_I4 &&
                       (VARIANT_LEVEL >= 2 || J->dst_kind != DST_F32);
    const int runs = !lanes && !tables && J->zmode != ZP_FLOAT &&
                     (J->src_kind > SRC_U4 || J->sk > SK_BF16 || J->zk > ZK_U4 || J->zmode == ZP_WIDE);
    /* Rows that share their params (groups along an outer axis; per channel on the last):
       lanes reads them widened from a row widened once per change of params, since decoding
       them at every element costs a quarter of its work.  Other rows, and rows longer than
       ROW_CACHE, it reads as given. */
    RowCache rc = {NULL, NULL, NULL, NULL, -1, 0};
    if (lanes && narrow_params && k >= 2 && J->pstride[k - 2] == 0 && L <= ROW_CACHE)
        V(row_cache_open)(&rc, J, L);
#endif
    const int src_size = SRC_SIZE[J->src_kind];
    Py_ssize_t e = start;
    while (e < stop) {
        Py_ssize_t n = L - col < stop - e ? L - col : stop - e;
        const char *sc_row = J->scales + poff * SCALE_SIZE[J->sk];
        const char *zp_row = J->zps ? J->zps + poff * ZP_SIZE[J->zk] : NULL;
#if VARIANT_LEVEL >= 1
        if (lanes) {
            int sk = J->sk, zk = J->zk;
            if (rc.on) {
                V(row_cache_fill)(&rc, J, sc_row, zp_row, L, poff);
                sc_row = (const char *)rc.sc;
                zp_row = (const char *)rc.zp;
                sk = SK_F32;
                zk = ZK_I32;
            }
            V_LANES(J->src + e * src_size, J->out + e * J->out_size, sc_row + col * SCALE_SIZE[sk],
                    zp_row ? zp_row + col * ZP_SIZE[zk] : NULL, n, J->src_kind, J->dst_kind, J->zmode, sk, zk,
                    J->stream);
            goto next_row;
        }
#endif
        for (Py_ssize_t j = 0; j < n; j += STAGE) {
            Py_ssize_t m = n - j < STAGE ? n - j : STAGE, c = col + j;
            const float *sc;
            const int32_t *zp;
            float sbuf[STAGE];
            int32_t zbuf[STAGE];
            /* the groups this block touches (at most STAGE / 2 + 2 of them, g >= 2), or its
               elements' params (g == 1: where kernels/native.py did not widen them), as aligned
               float32 / int32 */
            const Py_ssize_t g0 = c / g, count = (c + m - 1) / g - g0 + 1;
            V(widened)(J, sc_row, zp_row, g0, count, sbuf, zbuf, &sc, &zp);
            c -= g0 * g;
#if VARIANT_LEVEL >= 1
            if (tables) {
                V_TABLE(J->src + (e + j) * src_size, J->out + (e + j) * J->out_size, sc, zp, c, m, g, J->src_kind,
                        J->dst_kind, J->zmode, J->stream);
                continue;
            }
            if (runs) {
                V_RUNS(J->src + (e + j) * src_size, J->out + (e + j) * J->out_size, sc, zp, c, m, g, J->src_kind,
                       J->dst_kind, J->zmode, J->tab, J->tab16, J->stream);
                continue;
            }
            if (staged) {
                float buf[STAGE];
                segment(J->src + (e + j) * src_size, buf, sc, zp, c, m, g, J->src_kind, DST_F32, J->zmode, J->tab,
                        1);
                V_EMIT(buf, J->out + (e + j) * J->out_size, m, J->dst_kind, J->stream);
                continue;
            }
#endif
            segment(J->src + (e + j) * src_size, J->out + (e + j) * J->out_size, sc, zp, c, m, g, J->src_kind,
                    J->dst_kind, J->zmode, J->tab, VARIANT_LEVEL >= 1);
        }
#if VARIANT_LEVEL >= 1
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
#if VARIANT_LEVEL >= 1
    if (J->stream) dq_store_fence();
    free(rc.sbuf);
    free(rc.zbuf);
#endif
}

#undef V_EMIT
#undef V_LANES
#undef V_TABLE
#undef V_RUNS
#undef V
