/* gradscape summary kernel: float64 statistics and the float16 widening (see _fastsum.c, which
 * includes this file: one translation unit per instruction-set build). */
#pragma once

/* ---- float64 and float16 ---- */

static int64_t gs_key64(uint64_t u) {
    const int64_t si = (int64_t)u;
    return si ^ ((si >> 63) & INT64_MAX); /* double order as int order */
}

static double gs_key64_to_double(int64_t key) {
    const int64_t si = key < 0 ? (key ^ INT64_MAX) : key;
    const uint64_t u = (uint64_t)si;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* The statistics of n doubles, in double, into acc (the f64 fields). An all-finite chunk is one
 * pass; a chunk whose sums came out non-finite (a NaN or ±Inf in it, or squares past ~1e154) is
 * done again with every test on the bits and the non-finite values masked out. */
static void gs_chunk_f64(const double *restrict x, int32_t n, gs_acc_t *restrict acc) {
    double s = 0.0, ss = 0.0;
    int64_t kmn = INT64_MAX, kmx = INT64_MIN;
    int32_t nz = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, x + i, 8);
        const double v = x[i];
        s += v;
        ss += v * v;
        const int64_t key = gs_key64(u);
        kmn = key < kmn ? key : kmn;
        kmx = key > kmx ? key : kmx;
        nz += (u & 0x7fffffffffffffffull) != 0;
    }
    int32_t fi = n, nn = 0;
    if (!(gs_finite(s) && gs_finite(ss))) {
        s = ss = 0.0, kmn = INT64_MAX, kmx = INT64_MIN, nz = 0, fi = 0;
        for (int32_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, x + i, 8);
            const uint64_t a = u & 0x7fffffffffffffffull;
            if (a >= 0x7ff0000000000000ull) {
                nn += a > 0x7ff0000000000000ull;
                continue;
            }
            const double v = x[i];
            s += v;
            ss += v * v;
            const int64_t key = gs_key64(u);
            kmn = key < kmn ? key : kmn;
            kmx = key > kmx ? key : kmx;
            nz += a != 0;
            fi++;
        }
    }
    acc->sum += s;
    acc->sumsq += ss;
    acc->nz += nz;
    acc->nan += nn;
    acc->fin += fi;
    acc->kmn64 = kmn < acc->kmn64 ? kmn : acc->kmn64;
    acc->kmx64 = kmx > acc->kmx64 ? kmx : acc->kmx64;
}

/* float16 to float32, exactly and without branches or floating-point work on a subnormal. A normal,
 * Inf or NaN half has its exponent and mantissa bits moved to float32's places and its exponent
 * rebased by integer addition (112 = 127 - 15), the exponent set to all ones where the half's was (Inf,
 * NaN). A subnormal half is its 10-bit mantissa times 2^-24: an integer converted to float and scaled
 * by a power of two, exact, and normal in float32. An earlier version scaled every value by 2^112 as a
 * float, which fed float32 subnormals to the multiply wherever the half was subnormal (common in float16
 * gradients): x86 runs those through a microcode assist, ten times slower for the whole tensor. */
static void gs_widen_f16(const uint16_t *restrict h, int64_t m, float *restrict out) {
    const float tiny = 5.9604644775390625e-08f; /* 2^-24 */
    int64_t i = 0;
#if defined(__F16C__) /* the v3 and v4 builds: the CPU's own conversion, eight at a time */
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < m; i++) {
        const uint32_t mag = (uint32_t)(h[i] & 0x7fffu), sign = (uint32_t)(h[i] & 0x8000u) << 16;
        uint32_t w = (mag << 13) + (112u << 23);
        w |= (uint32_t)(-(int32_t)(mag >= 0x7c00u)) & 0x7f800000u;
        const float sub = (float)(int32_t)mag * tiny;
        uint32_t ws;
        memcpy(&ws, &sub, 4);
        w = mag < 0x400u ? ws : w;
        w |= sign;
        memcpy(out + i, &w, 4);
    }
}
