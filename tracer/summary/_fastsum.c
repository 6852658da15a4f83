/* gradscape: one pass over a gradient for all its statistics, plus its block-mean thumbnail.
 *
 * See NOTE [Summary cost] in stats.py and NOTE [Thumbnail views] in thumbnails.py. Built when gradscape is
 * installed (setup.py: an optional extension; no Python or torch headers needed) and loaded with
 * ctypes by kernel.py; without it the tracer falls back to torch reductions, which give the same
 * numbers in more passes. On x86-64 this file is built three times: with the baseline instruction
 * set (_fastsum), and for the x86-64-v3 (AVX2, FMA, F16C) and v4 (AVX-512) levels (_fastsum_v3/_v4);
 * the baseline build's gs_cpu_level() tells the loader which of them this CPU can run. gs_round_bf16
 * (at the end) rounds a thumbnail's float32 cells to bfloat16's precision in place.
 *
 * gs_summarise_f32 / _bf16 / _f16 / _f64(x, g, out): x is a contiguous buffer of n elements of that
 * type, and g = [n, planes, R, C, kr, kc, gc] (int64). out[0..8) receives, over the FINITE elements:
 *   [min, max, sum, sum of squares, non-zero count, NaN count, Inf count, finite count],
 * and, when planes > 0, the float32 thumbnail follows from out + 8 (one buffer: each argument
 * costs the Python caller time in ctypes). The return value is 0, or 1 when a float32 partial sum
 * overflowed (the caller recomputes in float64), or 2 when scratch memory could not be had.
 * gs_summarise_strided(x, g, lay, out) does the same for a float32, bfloat16 or float16 tensor of any strides,
 * reading it in place (its layout in lay) where the caller would otherwise copy it first.
 *
 * bfloat16 and float16 are widened to float32 (exactly: every value of either is a float32) a chunk
 * at a time and then summarised as float32 is. float64 statistics are computed in double from the
 * doubles themselves (gs_chunk_f64: the extremes are exact doubles, as torch's are), and its
 * thumbnail from the values rounded to float32, as the torch path's `thumbnail` rounds them.
 *
 * The thumbnail is made from the first `planes` R×C matrices of x: each is reduced to the means
 * of its kr×kc blocks (the last block of a row or column may be shorter), a tile of
 * ceil(R/kr)×ceil(C/kc), and the tiles are laid out row-major in a grid of gc columns; grid cells
 * without a plane are NaN. A 2-D view is one plane in a grid of one column; a rank-4 [N, C, H, W]
 * tensor is C planes of H×W (sample 0). NaN and Inf propagate into their block (raw values are
 * summed, not masked), so the picture shows where they are.
 *
 * One pass from memory: x is read in chunks of at most GS_CHUNK elements (whole rows of the
 * thumbnail's part where they fit, so that short rows come many to a chunk); each chunk feeds the
 * statistics and then, while it is still in cache, the thumbnail sums. Block sums are added block
 * by block (no division per element) into the thumbnail itself, which holds sums until the end,
 * when each cell is divided by its block's element count. Where a block spans several rows
 * (kr > 1), rows are first added column-wise into a row of partial sums (vectorised, up to four
 * rows at a time), which is folded into the blocks when the block row ends, or every GS_FLUSH
 * rows so that no float sum runs too long.
 *
 * The statistics loops are written so that compilers vectorise them WITHOUT -ffinite-math-only
 * (NaN must be seen): min/max compare integer keys that order like the floats, and in a chunk
 * that holds NaN or ±Inf (found from its float sums, which they poison) finiteness, NaN and zero
 * tests work on the IEEE bits and non-finite values are masked out of the float sums. Float
 * partials over at most GS_CHUNK elements are folded into doubles. In the builds with AVX2 (the
 * x86-64-v3 and v4 levels) the all-finite chunk is written with intrinsics instead, its own
 * gs_chunk (_fastsum_simd.h: eight lanes in the v3 build, sixteen in the v4 one): there the extremes
 * can be float minima and maxima, which compilers do not vectorise without that flag.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GS_CHUNK 4096
#define GS_FLUSH 64 /* rows summed in float before folding into the thumbnail */

typedef struct {
    double sum, sumsq;
    int64_t nz, nan, fin;
    int32_t kmn, kmx;       /* float32 extremes as order keys */
    int64_t kmn64, kmx64;   /* float64 extremes as order keys (gs_chunk_f64) */
} gs_acc_t;

/* A chunk with NaN or ±Inf: every test works on the bits, and non-finite values are masked out of
 * the sums and the extremes. */
static void gs_chunk_masked(const float *restrict x, int32_t n, gs_acc_t *restrict acc) {
    float s = 0.0f, ss = 0.0f;
    int32_t nz = 0, nn = 0, fi = 0, kmn = INT32_MAX, kmx = INT32_MIN;
    for (int32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4); /* the bits, without breaking strict aliasing */
        const uint32_t a = u & 0x7fffffffu;
        const int32_t fin = a < 0x7f800000u;
        const uint32_t m = (uint32_t)(-fin); /* all ones when finite */
        const uint32_t ub = u & m;
        float vf;
        memcpy(&vf, &ub, 4);
        s += vf;
        ss += vf * vf;
        const int32_t si = (int32_t)u;
        const int32_t key = si ^ ((si >> 31) & 0x7fffffff); /* float order as int order */
        const int32_t lo = (key & (int32_t)m) | (INT32_MAX & ~(int32_t)m);
        const int32_t hi = (key & (int32_t)m) | (INT32_MIN & ~(int32_t)m);
        kmn = lo < kmn ? lo : kmn;
        kmx = hi > kmx ? hi : kmx;
        nz += (a != 0u) & fin;
        nn += a > 0x7f800000u;
        fi += fin;
    }
    acc->sum += s;
    acc->sumsq += ss;
    acc->nz += nz;
    acc->nan += nn;
    acc->fin += fi;
    acc->kmn = kmn < acc->kmn ? kmn : acc->kmn;
    acc->kmx = kmx > acc->kmx ? kmx : acc->kmx;
}

static int gs_finitef(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x7f800000u) != 0x7f800000u;
}

/* Partial statistics of one of the four interleaved streams of gs_chunk. */
typedef struct {
    float s, ss;
    int32_t nz, kmn, kmx;
} gs_part_t;

static inline void gs_step(gs_part_t *p, float v) {
    int32_t si;
    memcpy(&si, &v, 4);
    p->s += v;
    p->ss += v * v;
    const int32_t key = si ^ ((si >> 31) & 0x7fffffff); /* float order as int order */
    p->kmn = key < p->kmn ? key : p->kmn;
    p->kmx = key > p->kmx ? key : p->kmx;
    p->nz += (si & 0x7fffffff) != 0; /* on the bits: denormals count even under DAZ */
}

/* The usual chunk, all finite: half the work of gs_chunk_masked. A NaN or ±Inf anywhere in it
 * makes s non-finite (in any order of additions: nothing here assumes finite math), and a value
 * past ~1e19 makes ss non-finite; then the chunk is done again by gs_chunk_masked. The chunk is
 * read as four streams with their own sums: one chain of float additions would wait on the
 * adder's latency (measured 1.3x faster in cache, 1.2x from memory). */
#if !(defined(__AVX2__) && defined(__FMA__)) /* else the AVX2 gs_chunk below */
static void gs_chunk(const float *restrict x, int32_t n, gs_acc_t *restrict acc) {
    gs_part_t p0 = {0.0f, 0.0f, 0, INT32_MAX, INT32_MIN}, p1 = p0, p2 = p0, p3 = p0;
    const int32_t q = n / 4;
    const float *restrict x1 = x + q, *restrict x2 = x + 2 * q, *restrict x3 = x + 3 * q;
    for (int32_t i = 0; i < q; i++) {
        const float v0 = x[i], v1 = x1[i], v2 = x2[i], v3 = x3[i];
        gs_step(&p0, v0);
        gs_step(&p1, v1);
        gs_step(&p2, v2);
        gs_step(&p3, v3);
    }
    for (int32_t i = 4 * q; i < n; i++) gs_step(&p0, x[i]);
    const float s = (p0.s + p1.s) + (p2.s + p3.s), ss = (p0.ss + p1.ss) + (p2.ss + p3.ss);
    if (!(gs_finitef(s) && gs_finitef(ss))) {
        gs_chunk_masked(x, n, acc);
        return;
    }
    const int32_t mn01 = p0.kmn < p1.kmn ? p0.kmn : p1.kmn, mn23 = p2.kmn < p3.kmn ? p2.kmn : p3.kmn;
    const int32_t mx01 = p0.kmx > p1.kmx ? p0.kmx : p1.kmx, mx23 = p2.kmx > p3.kmx ? p2.kmx : p3.kmx;
    const int32_t kmn = mn01 < mn23 ? mn01 : mn23, kmx = mx01 > mx23 ? mx01 : mx23;
    acc->sum += s;
    acc->sumsq += ss;
    acc->nz += (p0.nz + p1.nz) + (p2.nz + p3.nz);
    acc->fin += n;
    acc->kmn = kmn < acc->kmn ? kmn : acc->kmn;
    acc->kmx = kmx > acc->kmx ? kmx : acc->kmx;
}
#else
#include "_fastsum_simd.h" /* the AVX2 and AVX-512 chunks */
#endif

static double gs_key_to_double(int32_t key) {
    const int32_t si = key < 0 ? (key ^ 0x7fffffff) : key;
    const uint32_t u = (uint32_t)si;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

static int gs_finite(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

#include "_fastsum_wide.h" /* float64 and float16 */

static int gs_finish(const gs_acc_t *acc, int64_t n, int f64, double *out8) {
    const double nan = 0.0 / 0.0;
    out8[0] = !acc->fin ? nan : f64 ? gs_key64_to_double(acc->kmn64) : gs_key_to_double(acc->kmn);
    out8[1] = !acc->fin ? nan : f64 ? gs_key64_to_double(acc->kmx64) : gs_key_to_double(acc->kmx);
    out8[2] = acc->sum;
    out8[3] = acc->sumsq;
    out8[4] = (double)acc->nz;
    out8[5] = (double)acc->nan;
    out8[6] = (double)(n - acc->fin - acc->nan);
    out8[7] = (double)acc->fin;
    return gs_finite(acc->sum) && gs_finite(acc->sumsq) ? 0 : 1;
}

#include "_fastsum_thumb.h" /* the thumbnail */

enum { GS_F32, GS_BF16, GS_F16, GS_F64 };

/* The chunk of m elements from element s of x, as float32: x itself for float32, else widened (or,
 * for float64, rounded) into buf. */
static const float *gs_as_f32(const void *x, int kind, int64_t s, int64_t m, float *restrict buf) {
    if (kind == GS_F32) return (const float *)x + s;
    if (kind == GS_BF16) { /* bfloat16 is the top half of a float32 */
        const uint16_t *h = (const uint16_t *)x + s;
        for (int64_t i = 0; i < m; i++) {
            const uint32_t w = (uint32_t)h[i] << 16;
            memcpy(buf + i, &w, 4);
        }
    } else if (kind == GS_F16) {
        gs_widen_f16((const uint16_t *)x + s, m, buf);
    } else {
        const double *d = (const double *)x + s;
        for (int64_t i = 0; i < m; i++) buf[i] = (float)d[i];
    }
    return buf;
}

/* ---- strided tensors (NOTE [Strided gradients] in tracer/record/csrc/summaries.h) ---- */

#define GS_MAXDIM 8

/* n elements, `st` apart, from element `off` of x, as float32 into out. */
static void gs_run_f32(const void *x, int kind, int64_t off, int64_t st, int64_t n, float *restrict out) {
    if (kind == GS_F32) {
        const float *f = (const float *)x + off;
        if (st == 1) {
            memcpy(out, f, sizeof(float) * (size_t)n);
            return;
        }
        for (int64_t i = 0; i < n; i++) out[i] = f[i * st];
    } else if (kind == GS_BF16) {
        const uint16_t *h = (const uint16_t *)x + off;
        for (int64_t i = 0; i < n; i++) {
            const uint32_t w = (uint32_t)h[i * st] << 16;
            memcpy(out + i, &w, 4);
        }
    } else if (st == 1) {
        gs_widen_f16((const uint16_t *)x + off, n, out);
    } else {
        for (int64_t i = 0; i < n; i++) gs_widen_f16((const uint16_t *)x + off + i * st, 1, out + i);
    }
}

/* The chunk of m elements from logical element s of a strided tensor (lay = [ndim, sizes..., strides...], in
 * elements), gathered as float32 into buf: the elements a contiguous copy holds there, in its order. */
static const float *gs_gather(const void *x, int kind, const int64_t *lay, int64_t s, int64_t m,
                              float *restrict buf) {
    const int64_t nd = lay[0], *size = lay + 1, *stride = lay + 1 + nd;
    int64_t idx[GS_MAXDIM], off = 0, rem = s;
    for (int64_t d = nd - 1; d >= 0; d--) {
        idx[d] = rem % size[d];
        rem /= size[d];
        off += idx[d] * stride[d];
    }
    for (int64_t i = 0; i < m;) {
        const int64_t run = gs_min(size[nd - 1] - idx[nd - 1], m - i);
        gs_run_f32(x, kind, off, stride[nd - 1], run, buf + i);
        i += run;
        idx[nd - 1] += run;
        off += run * stride[nd - 1];
        for (int64_t d = nd - 1; d > 0 && idx[d] == size[d]; d--) { /* carry into the dimension outside */
            off += stride[d - 1] - size[d] * stride[d];
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
    return buf;
}

/* lay: NULL for a contiguous x; else x's strided layout (gs_gather), for float32, bfloat16 and float16. */
static int gs_summarise(const void *x, int kind, const int64_t *g, const int64_t *lay, double *out8) {
    float *thumb = g[1] > 0 ? (float *)(out8 + 8) : NULL;
    const int64_t n = g[0];
    gs_acc_t acc;
    memset(&acc, 0, sizeof(acc));
    acc.kmn = INT32_MAX;
    acc.kmx = INT32_MIN;
    acc.kmn64 = INT64_MAX;
    acc.kmx64 = INT64_MIN;
    float stack_rowacc[GS_CHUNK];
    float buf[GS_CHUNK];
    gs_thumb_t T;
    if (gs_thumb_init(&T, g, thumb, stack_rowacc)) return 2;
    /* in the thumbnail's part, chunks of whole rows where they fit (several rows add at once) */
    const int64_t nthumb = T.left, rows = T.C > 0 && T.C <= GS_CHUNK ? (GS_CHUNK / T.C) * T.C : GS_CHUNK;
    for (int64_t s = 0, m; s < n; s += m) {
        m = gs_min(n - s, s < nthumb ? rows : GS_CHUNK);
        if (kind == GS_F64) {
            gs_chunk_f64((const double *)x + s, (int32_t)m, &acc);
            if (T.left > 0) gs_thumb_chunk(&T, gs_as_f32(x, kind, s, gs_min(m, T.left), buf), m);
            continue;
        }
        const float *v = lay != NULL ? gs_gather(x, kind, lay, s, m, buf) : gs_as_f32(x, kind, s, m, buf);
        gs_chunk(v, (int32_t)m, &acc);
        if (T.left > 0) gs_thumb_chunk(&T, v, m);
    }
    if (T.thumb) gs_thumb_finish(&T);
    if (T.rowacc && T.rowacc != stack_rowacc) free(T.rowacc);
    return gs_finish(&acc, n, kind == GS_F64, out8);
}

int gs_summarise_f32(const float *x, const int64_t *g, double *out) { return gs_summarise(x, GS_F32, g, NULL, out); }

int gs_summarise_bf16(const uint16_t *x, const int64_t *g, double *out) { return gs_summarise(x, GS_BF16, g, NULL, out); }

int gs_summarise_f16(const uint16_t *x, const int64_t *g, double *out) { return gs_summarise(x, GS_F16, g, NULL, out); }

int gs_summarise_f64(const double *x, const int64_t *g, double *out) { return gs_summarise(x, GS_F64, g, NULL, out); }

/* As the others, for a float32, bfloat16 or float16 tensor of any strides (a permutation, an expansion, a
 * slice): lay = [dtype (0 float32, 1 bfloat16, 2 float16), ndim (1..GS_MAXDIM), sizes..., strides...
 * (in elements)], x its first element. The same summary as of its contiguous copy, bitwise: the same elements
 * in the same chunks. 3: a layout it does not take. */
int gs_summarise_strided(const void *x, const int64_t *g, const int64_t *lay, double *out) {
    if (lay[0] < GS_F32 || lay[0] > GS_F16 || lay[1] < 1 || lay[1] > GS_MAXDIM) return 3;
    return gs_summarise(x, (int)lay[0], g, lay + 1, out);
}

/* cells[0..n) rounded in place to bfloat16's precision (kept as float32): to nearest, ties to even, as
 * torch rounds, every NaN as the one quiet NaN (NOTE [Arena thumbnails] in tracer/summary/bfloat16.py,
 * which calls this for the thumbnails the Python summariser makes; branch-free, so it vectorises). */
void gs_round_bf16(float *cells, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, cells + i, 4);
        const uint32_t r = ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16) << 16;
        b = (b & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : r;
        memcpy(cells + i, &b, 4);
    }
}

/* The highest build of this file that the CPU (and the OS, for the wider registers) can run:
 * 4 for the AVX-512 build, 3 for the AVX2 build, 0 for the baseline only. */
int gs_cpu_level(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
          __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c")))
        return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return 4;
    return 3;
#else
    return 0;
#endif
}
