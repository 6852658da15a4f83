/* gradscape: one pass over a gradient for all its statistics, plus its block-mean thumbnail.
 *
 * See NOTE [Summary cost] in _summary.py. Built on first use with the system C compiler and loaded
 * with ctypes (no Python or torch headers needed); without a compiler the tracer falls back to torch
 * reductions, which give the same numbers in more passes.
 *
 * x is a contiguous rows×cols matrix. out8 receives, over the FINITE elements:
 *   [min, max, sum, sum of squares, non-zero count, NaN count, Inf count, finite count].
 * If thumb is not NULL it receives the mean of each kr×kc block (the last block of a row or column
 * may be shorter); NaN and Inf propagate into their block, so the picture shows where they are.
 * rowacc is scratch space of cols floats.
 *
 * The chunk loop is written so that compilers vectorise it WITHOUT -ffinite-math-only (NaN must be
 * seen): finiteness, NaN and zero tests work on the IEEE bits, min/max compare integer keys that
 * order like the floats, and non-finite values are masked out of the float sums. Float partials
 * over at most GS_CHUNK elements are folded into doubles.
 */
#include <stdint.h>
#include <string.h>

#define GS_CHUNK 4096

typedef struct {
    double sum, sumsq;
    int64_t nz, nan, fin;
    int32_t kmn, kmx;
} gs_acc_t;

static void gs_chunk(const uint32_t *restrict x, int32_t n, gs_acc_t *restrict acc) {
    float s = 0.0f, ss = 0.0f;
    int32_t nz = 0, nn = 0, fi = 0, kmn = INT32_MAX, kmx = INT32_MIN;
    for (int32_t i = 0; i < n; i++) {
        const uint32_t u = x[i];
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

static double gs_key_to_double(int32_t key) {
    const int32_t si = key < 0 ? (key ^ 0x7fffffff) : key;
    const uint32_t u = (uint32_t)si;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

static void gs_finish(const gs_acc_t *acc, int64_t n, double *out8) {
    const double nan = 0.0 / 0.0;
    out8[0] = acc->fin ? gs_key_to_double(acc->kmn) : nan;
    out8[1] = acc->fin ? gs_key_to_double(acc->kmx) : nan;
    out8[2] = acc->sum;
    out8[3] = acc->sumsq;
    out8[4] = (double)acc->nz;
    out8[5] = (double)acc->nan;
    out8[6] = (double)(n - acc->fin - acc->nan);
    out8[7] = (double)acc->fin;
}

/* rowacc holds the sum of the rows of the current block: after its last row, turn it into block means */
static void gs_fold_rows(int64_t r, int64_t rows, int64_t cols, int64_t kr, int64_t kc, float *restrict thumb,
                         int64_t tcols, float *restrict rowacc) {
    if ((r + 1) % kr != 0 && r + 1 != rows) return;
    const int64_t br = r / kr;
    const int64_t nrows = r - br * kr + 1;
    float *out = thumb + br * tcols;
    for (int64_t c = 0; c < cols; c++) out[c / kc] += rowacc[c];
    for (int64_t b = 0; b < tcols; b++) {
        const int64_t ncols = (b + 1) * kc <= cols ? kc : cols - b * kc;
        out[b] /= (float)(nrows * ncols);
    }
    memset(rowacc, 0, sizeof(float) * (size_t)cols);
}

static void gs_init(gs_acc_t *acc, float *thumb, int64_t trows, int64_t tcols, float *rowacc, int64_t cols) {
    memset(acc, 0, sizeof(*acc));
    acc->kmn = INT32_MAX;
    acc->kmx = INT32_MIN;
    if (thumb) {
        memset(thumb, 0, sizeof(float) * (size_t)(trows * tcols));
        memset(rowacc, 0, sizeof(float) * (size_t)cols);
    }
}

void gs_summarise_f32(const float *x, int64_t rows, int64_t cols, int64_t kr, int64_t kc, float *thumb,
                      int64_t trows, int64_t tcols, float *rowacc, double *out8) {
    gs_acc_t acc;
    gs_init(&acc, thumb, trows, tcols, rowacc, cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += GS_CHUNK) {
            const int64_t n = cols - c0 < GS_CHUNK ? cols - c0 : GS_CHUNK;
            gs_chunk((const uint32_t *)(row + c0), (int32_t)n, &acc);
        }
        if (thumb) {
            for (int64_t c = 0; c < cols; c++) rowacc[c] += row[c];
            gs_fold_rows(r, rows, cols, kr, kc, thumb, tcols, rowacc);
        }
    }
    gs_finish(&acc, rows * cols, out8);
}

void gs_summarise_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t kr, int64_t kc, float *thumb,
                       int64_t trows, int64_t tcols, float *rowacc, double *out8) {
    gs_acc_t acc;
    uint32_t buf[GS_CHUNK];
    gs_init(&acc, thumb, trows, tcols, rowacc, cols);
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += GS_CHUNK) {
            const int64_t n = cols - c0 < GS_CHUNK ? cols - c0 : GS_CHUNK;
            for (int64_t i = 0; i < n; i++) buf[i] = ((uint32_t)row[c0 + i]) << 16;
            gs_chunk(buf, (int32_t)n, &acc);
            if (thumb) {
                for (int64_t i = 0; i < n; i++) {
                    float f;
                    memcpy(&f, &buf[i], 4);
                    rowacc[c0 + i] += f;
                }
            }
        }
        if (thumb) gs_fold_rows(r, rows, cols, kr, kc, thumb, tcols, rowacc);  /* rowacc has this row */
    }
    gs_finish(&acc, rows * cols, out8);
}
