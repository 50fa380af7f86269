/* Winograd F(4x4, 3x3) transforms for gawee's oneDNN-primitives runtime (gawee/backend/winograd.py).
 *
 * A 3x3 stride-1 convolution computed as 36 matrix products (oneDNN's matmul primitive) between transforms:
 *   V[e][t][c] = (B^T d B)[e]   for each 6x6 input tile d (stride 4) of channel c,   e = 0..35, t = tile
 *   M[e][t][k] = sum_c V[e][t][c] U[e][c][k]                   (U = G g G^T, the weights, transformed once)
 *   y = A^T M A                 4x4 outputs per tile, + bias, + residual, then the activation
 * (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). 2.25x fewer multiplications than
 * the direct convolution in the products, plus the transforms.
 *
 * Activations are read and written where oneDNN keeps them: element (n, c, h, w) at
 *   n*sn + (c / blk)*scb + h*sh + w*sw + c % blk
 * which is nChw8c / nChw16c (blk 8 / 16) and NHWC (blk = C, scb = 0). Channels come in vectors of 8
 * (GCC's vector extension; -march=native picks the instructions), so C and K are multiples of 8 and blk too.
 * Threads: OpenMP, the runtime torch and oneDNN share.
 */
#define LANES 8
#include "vec.h"

/* r = B^T d over 6 values a stride apart. */
#define BT6(d, r)                                                   \
    do {                                                            \
        vf d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3], d4 = d[4], d5 = d[5]; \
        r[0] = 4.0f * d0 - 5.0f * d2 + d4;                          \
        r[1] = -4.0f * (d1 + d2) + d3 + d4;                         \
        r[2] = 4.0f * (d1 - d2) - d3 + d4;                          \
        r[3] = 2.0f * (d3 - d1) - d2 + d4;                          \
        r[4] = 2.0f * (d1 - d3) - d2 + d4;                          \
        r[5] = 4.0f * d1 - 5.0f * d3 + d5;                          \
    } while (0)

/* r = A^T m over 6 values. */
#define AT6(m, r)                                                   \
    do {                                                            \
        vf m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3], m4 = m[4], m5 = m[5]; \
        vf p12 = m1 + m2, d12 = m1 - m2, p34 = m3 + m4, d34 = m3 - m4; \
        r[0] = m0 + p12 + p34;                                      \
        r[1] = d12 + 2.0f * d34;                                    \
        r[2] = p12 + 4.0f * p34;                                    \
        r[3] = d12 + 8.0f * d34 + m5;                               \
    } while (0)

typedef struct {
    long sn, scb, sh, sw; /* strides in floats */
    int blk;              /* channels per block */
} layout_t;

static inline long at(const layout_t *l, int n, int c, int h, int w) {
    return n * l->sn + (long)(c / l->blk) * l->scb + h * l->sh + w * l->sw + c % l->blk;
}

/* V[36][T][C] from src (N, C, H, W): the tiles of rows r0 .. r0 + R - 1 (row r: image r / TH, tile row r % TH),
 * T = R * TW of them; tiles of 6x6 at (4*th - pt, 4*tw - pl), zero outside. */
int gawee_wino_input(const float *src, float *V, int C, int H, int W, long sn, long scb, long sh, long sw,
                     int blk, int pt, int pl, int TH, int TW, int r0, int R) {
    const layout_t l = {sn, scb, sh, sw, blk};
    const long T = (long)R * TW;
    const int CV = C / 8;
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < R; r++)
            for (int cv = 0; cv < CV; cv++) {
                const int n = (r0 + r) / TH, th = (r0 + r) % TH, c = cv * 8;
                for (int tw = 0; tw < TW; tw++) {
                    vf d[6][6], t[6][6], e[6];
                    const int h0 = th * 4 - pt, w0 = tw * 4 - pl;
                    for (int i = 0; i < 6; i++)
                        for (int j = 0; j < 6; j++) {
                            const int h = h0 + i, w = w0 + j;
                            d[i][j] = (h >= 0 && h < H && w >= 0 && w < W) ? load(src + at(&l, n, c, h, w))
                                                                           : (vf){0};
                        }
                    for (int j = 0; j < 6; j++) { /* columns: t = B^T d */
                        vf col[6] = {d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j]};
                        BT6(col, e);
                        for (int i = 0; i < 6; i++) t[i][j] = e[i];
                    }
                    const long tile = (long)r * TW + tw;
                    for (int i = 0; i < 6; i++) { /* rows: t B */
                        BT6(t[i], e);
                        for (int j = 0; j < 6; j++) store(V + ((long)(i * 6 + j) * T + tile) * C + c, e[j]);
                    }
                }
            }
    return 0;
}

/* dst (N, K, OH, OW) = act(A^T M A + bias + residual) for the tiles of rows r0 .. r0 + R - 1 (M holds theirs,
 * as gawee_wino_input's V); residual (may be NULL) in dst's layout. act: 0 none, 1 relu. */
int gawee_wino_output(const float *M, float *dst, const float *bias, const float *res, int act, int K,
                      int OH, int OW, long sn, long scb, long sh, long sw, int blk, int TH, int TW, int r0, int R) {
    const layout_t l = {sn, scb, sh, sw, blk};
    const long T = (long)R * TW;
    const int KV = K / 8;
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < R; r++)
            for (int kv = 0; kv < KV; kv++) {
                const int n = (r0 + r) / TH, th = (r0 + r) % TH, k = kv * 8;
                const vf b = load(bias + k);
                for (int tw = 0; tw < TW; tw++) {
                    vf m[6][6], t[4][6], a[6], y[4];
                    const long tile = (long)r * TW + tw;
                    for (int i = 0; i < 6; i++)
                        for (int j = 0; j < 6; j++) m[i][j] = load(M + ((long)(i * 6 + j) * T + tile) * K + k);
                    for (int j = 0; j < 6; j++) { /* columns: t = A^T m */
                        vf col[6] = {m[0][j], m[1][j], m[2][j], m[3][j], m[4][j], m[5][j]};
                        AT6(col, a);
                        for (int i = 0; i < 4; i++) t[i][j] = a[i];
                    }
                    for (int i = 0; i < 4; i++) { /* rows: t A */
                        const int h = th * 4 + i;
                        if (h >= OH) break;
                        AT6(t[i], y);
                        for (int j = 0; j < 4; j++) {
                            const int w = tw * 4 + j;
                            if (w >= OW) break;
                            const long o = at(&l, n, k, h, w);
                            vf v = y[j] + b;
                            if (res) v += load(res + o);
                            if (act == 1) v = relu_mask(v);
                            store(dst + o, v);
                        }
                    }
                }
            }
    return 0;
}
