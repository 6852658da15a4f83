/* gradscape summary kernel: the block-mean thumbnail (see _fastsum.c, which includes this file:
 * one translation unit per instruction-set build). */
#pragma once

/* ---- thumbnail ---- */

typedef struct {
    int64_t planes, R, C, kr, kc, gc, tR, tC, ocols; /* geometry (see the top of the file) */
    int64_t left;                                    /* thumbnail elements not yet seen */
    int64_t p, r, c;        /* the next element: plane, row, column */
    int64_t rb, nacc;       /* rows of the current block row seen; rows summed in rowacc */
    float *thumb, *orow;    /* the output; the output row of the current block row */
    float *rowacc;          /* C partial column sums when kr > 1 */
} gs_thumb_t;

/* o[b] += the sum of the K values from v + b*K, for b < nb. K is a constant in each copy, so
 * compilers vectorise the small ones (interleaved loads) and unroll the others. */
#define GS_FOLD_K(K)                                                              \
    static void gs_fold_##K(const float *restrict v, int64_t nb, float *restrict o) { \
        for (int64_t b = 0; b < nb; b++) {                                        \
            float s = 0.0f;                                                       \
            for (int j = 0; j < K; j++) s += v[b * K + j];                        \
            o[b] += s;                                                            \
        }                                                                         \
    }
GS_FOLD_K(2)
GS_FOLD_K(3)
GS_FOLD_K(4)
GS_FOLD_K(5)
GS_FOLD_K(6)
GS_FOLD_K(7)
GS_FOLD_K(8)

static float gs_sum(const float *restrict v, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

/* Add v[0..n), columns c0.. of one row, into the block sums o[c / kc]. */
static void gs_fold(const float *restrict v, int64_t c0, int64_t n, int64_t kc, float *restrict o) {
    if (kc == 1) {
        o += c0;
        for (int64_t i = 0; i < n; i++) o[i] += v[i];
        return;
    }
    int64_t b = c0 / kc, i = 0; /* once per row segment */
    const int64_t head = (b + 1) * kc - c0;
    if (head < kc) { /* the segment starts inside a block */
        i = head < n ? head : n;
        o[b++] += gs_sum(v, i);
    }
    const int64_t nb = (n - i) / kc;
    const float *w = v + i;
    float *ob = o + b;
    switch (kc) {
    case 2: gs_fold_2(w, nb, ob); break;
    case 3: gs_fold_3(w, nb, ob); break;
    case 4: gs_fold_4(w, nb, ob); break;
    case 5: gs_fold_5(w, nb, ob); break;
    case 6: gs_fold_6(w, nb, ob); break;
    case 7: gs_fold_7(w, nb, ob); break;
    case 8: gs_fold_8(w, nb, ob); break;
    default:
        for (int64_t j = 0; j < nb; j++) ob[j] += gs_sum(w + j * kc, kc);
    }
    i += nb * kc;
    if (i < n) ob[nb] += gs_sum(v + i, n - i); /* the segment ends inside a block */
}

static float *gs_tile(const gs_thumb_t *T, int64_t p) {
    return T->thumb + (p / T->gc) * T->tR * T->ocols + (p % T->gc) * T->tC;
}

static void gs_fold_rowacc(gs_thumb_t *T) {
    gs_fold(T->rowacc, 0, T->C, T->kc, T->orow);
    memset(T->rowacc, 0, sizeof(float) * (size_t)T->C);
    T->nacc = 0;
}

/* The current row is complete. */
static void gs_next_row(gs_thumb_t *T) {
    T->c = 0;
    const int end_plane = ++T->r == T->R;
    if (T->kr > 1) {
        const int end_block = end_plane || ++T->rb == T->kr;
        if (end_block || ++T->nacc == GS_FLUSH) gs_fold_rowacc(T);
        if (!end_block) return;
        T->rb = 0;
    }
    T->orow += T->ocols;
    if (end_plane) {
        T->r = 0;
        if (++T->p < T->planes) T->orow = gs_tile(T, T->p);
    }
}

static int64_t gs_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* ra += the sum of the q rows of C values at v: up to four rows per pass over ra (its loads and
 * stores cost more than the additions). */
static void gs_add_rows(float *restrict ra, const float *restrict v, int64_t C, int64_t q) {
    for (; q >= 4; q -= 4, v += 4 * C)
        for (int64_t i = 0; i < C; i++) ra[i] += (v[i] + v[i + C]) + (v[i + 2 * C] + v[i + 3 * C]);
    if (q == 3)
        for (int64_t i = 0; i < C; i++) ra[i] += (v[i] + v[i + C]) + v[i + 2 * C];
    else if (q == 2)
        for (int64_t i = 0; i < C; i++) ra[i] += v[i] + v[i + C];
    else if (q == 1)
        for (int64_t i = 0; i < C; i++) ra[i] += v[i];
}

/* The next m elements of x (a chunk, in cache): add them into the block sums. */
static void gs_thumb_chunk(gs_thumb_t *restrict T, const float *restrict v, int64_t m) {
    if (m > T->left) m = T->left;
    T->left -= m;
    while (m > 0) {
        const int64_t c0 = T->c;
        int64_t seg = gs_min(T->C - c0, m);
        if (T->kr == 1) {
            gs_fold(v, c0, seg, T->kc, T->orow);
        } else if (c0 == 0 && m >= 2 * T->C) { /* whole rows of one block row, several at once */
            const int64_t q = gs_min(gs_min(m / T->C, T->kr - T->rb), gs_min(T->R - T->r, GS_FLUSH - T->nacc));
            gs_add_rows(T->rowacc, v, T->C, q);
            seg = q * T->C;
            T->r += q - 1; /* gs_next_row below counts the last one; none of the others ends anything */
            T->rb += q - 1;
            T->nacc += q - 1;
        } else {
            gs_add_rows(T->rowacc + c0, v, seg, 1);
        }
        v += seg;
        m -= seg;
        T->c = c0 + seg;
        if (T->c >= T->C) gs_next_row(T);
    }
}

/* Sums to means; empty grid cells to NaN. A float sum divided by a block's element count in
 * float is the double quotient rounded to float (double has more than twice float's precision, so
 * rounding twice changes no quotient), while the count is exact in float: below 2^24. The float
 * division of a row's full blocks by one count vectorises; the double one per cell did not. A count
 * that is a power of two (most blocks of a model's power-of-two widths) multiplies by its reciprocal
 * instead, which is exact: both round the same real quotient once, so the cells are bitwise the
 * division's, at a fraction of its cost (division was most of a transformer step's thumbnail finish). */
static void gs_thumb_finish(const gs_thumb_t *T) {
    if (T->kr > 1 || T->kc > 1) {
        const int64_t full = T->C / T->kc; /* column blocks of kc columns; a last one may be shorter */
        for (int64_t p = 0; p < T->planes; p++) {
            float *tile = gs_tile(T, p);
            for (int64_t i = 0; i < T->tR; i++) {
                const int64_t rn = T->R - i * T->kr < T->kr ? T->R - i * T->kr : T->kr;
                float *restrict o = tile + i * T->ocols;
                int64_t j = 0;
                const int64_t n = rn * T->kc;
                if (n < ((int64_t)1 << 24) && (n & (n - 1)) == 0) {
                    const float inv = 1.0f / (float)n; /* exact: a power of two */
                    for (; j < full; j++) o[j] = o[j] * inv;
                } else if (n < ((int64_t)1 << 24)) {
                    const float count = (float)n;
                    for (; j < full; j++) o[j] = o[j] / count;
                }
                for (; j < T->tC; j++) {
                    const int64_t cn = T->C - j * T->kc < T->kc ? T->C - j * T->kc : T->kc;
                    o[j] = (float)((double)o[j] / (double)(rn * cn));
                }
            }
        }
    }
    const int64_t cells = ((T->planes + T->gc - 1) / T->gc) * T->gc;
    const float nan = 0.0f / 0.0f;
    for (int64_t p = T->planes; p < cells; p++) {
        float *tile = gs_tile(T, p);
        for (int64_t i = 0; i < T->tR; i++)
            for (int64_t j = 0; j < T->tC; j++) tile[i * T->ocols + j] = nan;
    }
}

/* g: [n, planes, R, C, kr, kc, gc]; returns 0, or 2 when rowacc cannot be allocated. */
static int gs_thumb_init(gs_thumb_t *T, const int64_t *g, float *thumb, float *stack_rowacc) {
    memset(T, 0, sizeof(*T));
    if (!thumb) return 0;
    T->planes = g[1], T->R = g[2], T->C = g[3], T->kr = g[4], T->kc = g[5], T->gc = g[6];
    T->tR = (T->R + T->kr - 1) / T->kr;
    T->tC = (T->C + T->kc - 1) / T->kc;
    T->ocols = T->gc * T->tC;
    T->left = T->planes * T->R * T->C;
    T->thumb = thumb;
    T->orow = thumb;
    const int64_t orows = ((T->planes + T->gc - 1) / T->gc) * T->tR;
    memset(thumb, 0, sizeof(float) * (size_t)(orows * T->ocols));
    if (T->kr > 1) {
        T->rowacc = T->C <= GS_CHUNK ? stack_rowacc : (float *)malloc(sizeof(float) * (size_t)T->C);
        if (!T->rowacc) return 2;
        memset(T->rowacc, 0, sizeof(float) * (size_t)T->C);
    }
    return 0;
}
