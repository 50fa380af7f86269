/* Depthwise convolution (one input and one output channel per group), for gawee's oneDNN-primitives runtime
 * (gawee/backend/depthwise.py): MobileNet's and EfficientNet's k x k depthwise convolutions with their activations.
 *
 * y[n][c][oh][ow] = act(bias[c] + res[..] + sum_{kh,kw} act_in(x[n][c][ih][iw]) * w[c][kh][kw]),
 *   ih = oh*SH - PT + kh*DH,  iw = ow*SW - PL + kw*DW  (zero outside the image).
 *
 * act_in is the activation of the convolution's input, taken from its producer (which then writes it
 * unactivated): it is applied once per input element, as the rows are read.
 *
 * A vector holds V channels (16 where the CPU has AVX-512, else 8): channel chunk cb of pixel (n, h, w) is the V
 * floats at n*sn + cb*scb + h*sh + w*sw, which is nChw16c / nChw8c (the block is V: scb = H*W*V, sw = V) and NHWC
 * (scb = V, sw = C). A work item is an image's chunk and a band of output rows. It keeps the input rows the
 * current output row reads in a ring (a thread's, on the heap: RING floats at most; at most 64 kernel rows), each row
 * activated and with zero columns for the padding on both sides, so no tap checks bounds; rows outside the image
 * read a zero row. An output row is computed in tiles of up to UR pixels (UR accumulators; each tap's weight
 * vector loaded once per tile). The filters are packed once (depthwise.py) as [cb][kh][kw][V], zero past the
 * channels, so a blocked layout's padding lanes come out act(0) = 0 for the activations offered (each maps 0 to
 * 0). The epilogue adds the bias and a residual and applies the activation: ReLU, SiLU (x / (1 + e^-x), e^x by
 * Cody-Waite reduction and Cephes' polynomial, rel. error < 2e-7) or hardswish. Threads: OpenMP over (image,
 * chunk, band), the runtime torch and oneDNN share; about four bands per thread.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
#include "vec.h"

enum { V = LANES };

enum { UR = 8, RING = 1 << 20 };
/* Pixels per tile at most; the floats of a work item's rows at most (depthwise.py offers the kernel only where
 * they fit: (kernel rows' span + 1) x padded width x V). */

#if defined(__AVX512F__)
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
static inline vf vmin(vf a, vf b) { return (vf)_mm512_min_ps((__m512)a, (__m512)b); }
#elif defined(__AVX__)
static inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
static inline vf vmin(vf a, vf b) { return (vf)_mm256_min_ps((__m256)a, (__m256)b); }
#else
static inline vf vmax(vf a, vf b) { return (vf)(((vi)a & (a > b)) | ((vi)b & ~(a > b))); }
static inline vf vmin(vf a, vf b) { return (vf)(((vi)a & (a < b)) | ((vi)b & ~(a < b))); }
#endif

/* e^x for x in [-87, 88] (clamped there): x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' expf polynomial, times 2^n
 * (AVX-512's scalef, else n + 127 in the exponent's bits). */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
#if defined(__AVX512F__)
    const vf n = (vf)_mm512_roundscale_ps((__m512)(x * 1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT);
#else
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const vf n = (x * 1.44269504088896341f + magic) - magic;
#endif
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
#if defined(__AVX512F__)
    return (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    const vi scale = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)scale;
#endif
}

/* 1 / d for d >= 1: the CPU's reciprocal estimate and one Newton step (rel. error < 1e-7 from AVX-512's 14-bit
 * estimate, < 3e-7 from AVX's 12-bit one), a few cycles against a division's ten or more. */
static inline vf reciprocal(vf d) {
#if defined(__AVX512F__)
    const vf r = (vf)_mm512_rcp14_ps((__m512)d);
    return r * (2.0f - d * r);
#elif defined(__AVX__)
    const vf r = (vf)_mm256_rcp_ps((__m256)d);
    return r * (2.0f - d * r);
#else
    return 1.0f / d;
#endif
}

/* The activation of ``n`` vectors, a constant in each copy: the loop inside each case interleaves their
 * independent chains (SiLU's e^x is some twenty dependent operations). */
static inline __attribute__((always_inline)) void activate(vf *v, const int n, int act) {
    switch (act) {
    case 1:
        for (int p = 0; p < n; p++)
            v[p] = vmax(v[p], (vf){0});
        break;
    case 2:
        for (int p = 0; p < n; p++)
            v[p] = v[p] * reciprocal(1.0f + vexp(-v[p]));
        break;
    case 3:
        for (int p = 0; p < n; p++)
            v[p] = v[p] * vmin(vmax(v[p] * (1.0f / 6) + 0.5f, (vf){0}), splat(1.0f));
        break;
    default:
        break;
    }
}

/* ``ur`` output pixels from column ow (a constant in each copy: the accumulators stay in registers) at stride
 * ``sw``; ``rows[kh]`` is kernel row kh's input row, padded (column j is iw = j - PL). */
static inline __attribute__((always_inline)) void tile(const int ur, const int sw, const float *const *rows, int KH,
                                                        int KW, int DW, int ow, const float *w, vf b,
                                                        const float *res, float *y, long dw, int act) {
    vf acc[UR];
    for (int p = 0; p < ur; p++)
        acc[p] = b;
    for (int kh = 0; kh < KH; kh++) {
        const float *row = rows[kh] + (long)ow * sw * V;
        for (int kw = 0; kw < KW; kw++) {
            const vf wv = load(w + (kh * KW + kw) * V);
            const float *at = row + (long)kw * DW * V;
            _Pragma("GCC unroll 8") for (int p = 0; p < ur; p++) acc[p] += load(at + p * sw * V) * wv;
        }
    }
    if (res)
        for (int p = 0; p < ur; p++)
            acc[p] += load(res + (ow + p) * dw);
    activate(acc, ur, act);
    for (int p = 0; p < ur; p++)
        store(y + (ow + p) * dw, acc[p]);
}

#define TILES(sw)                                                                                                  \
    switch (ur) {                                                                                                  \
        CASE(1, sw) CASE(2, sw) CASE(3, sw) CASE(4, sw) CASE(5, sw) CASE(6, sw) CASE(7, sw) CASE(8, sw)            \
        default : break;                                                                                           \
    }
#define CASE(r, sw)                                                                                                \
    case r:                                                                                                        \
        tile(r, sw, rows, KH, KW, DW, ow, w, b, r_, y, dw, act);                                                   \
        break;

/* Input row ih of a chunk, activated, into the ring's padded row ``to`` (its padding columns stay zero). */
static void fill(float *to, const float *x, long sh, long sw, int ih, int W, int PL, int act_in) {
    const float *from = x + ih * sh;
    float *into = to + (long)PL * V;
    int iw = 0;
    for (; iw + UR <= W; iw += UR) {
        vf v[UR];
        for (int p = 0; p < UR; p++)
            v[p] = load(from + (iw + p) * sw);
        activate(v, UR, act_in);
        for (int p = 0; p < UR; p++)
            store(into + (iw + p) * V, v[p]);
    }
    for (; iw < W; iw++) {
        vf v = load(from + iw * sw);
        activate(&v, 1, act_in);
        store(into + iw * V, v);
    }
}

int gawee_depthwise_width(void) { return V; }

int gawee_depthwise_ring(void) { return RING; }

int gawee_depthwise_conv(const float *src, const float *wp, const float *bias, const float *res, float *dst, int N,
                         int CB, int H, int W, long sn, long scb, long sh, long sw, int OH, int OW, long dn, long dcb,
                         long dh, long dw, int KH, int KW, int SH, int SW, int PT, int PL, int DH, int DW, int act,
                         int act_in) {
    const int span = (KH - 1) * DH + 1;          /* the input rows an output row reads */
    int wp_ = (OW - 1) * SW + (KW - 1) * DW + 1; /* the padded row's columns */
    wp_ = wp_ > PL + W ? wp_ : PL + W;
    if (act < 0 || act > 3 || act_in < 0 || act_in > 3 || SH < 1 || SW < 1 || DH < 1 || DW < 1 || KH < 1 ||
        KH > 64 || (long)(span + 1) * wp_ * V > RING)
        return 1;
    const long row = (long)wp_ * V;
    const int planes = N * CB, threads = omp_get_max_threads();
    int bands = (4 * threads + planes - 1) / planes; /* about four work items per thread */
    bands = bands < 1 ? 1 : bands > OH ? OH : bands;
    const int per = (OH + bands - 1) / bands;
    const size_t bytes = ((size_t)(span + 1) * row * sizeof(float) + 63) / 64 * 64;
    int failed = 0;
#pragma omp parallel
    {
        /* zeroed once: the padding columns and the zero row are never written, every row read is filled first */
        float *ring = aligned_alloc(64, bytes);
        if (ring)
            memset(ring, 0, bytes);
        else {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(3) schedule(static)
        for (int n = 0; n < N; n++)
            for (int cb = 0; cb < CB; cb++)
                for (int band = 0; band < bands; band++) {
                    if (!ring)
                        continue;
                    const float *zero = ring + (long)span * row;
                    const float *x = src + n * sn + cb * scb, *w = wp + (long)cb * KH * KW * V;
                    const vf b = load(bias + cb * V);
                    const int oh1 = (band + 1) * per < OH ? (band + 1) * per : OH;
                    int next = -(1 << 30); /* the next input row the ring lacks */
                    for (int oh = band * per; oh < oh1; oh++) {
                        const int ih0 = oh * SH - PT;
                        for (int ih = ih0 > next ? ih0 : next; ih < ih0 + span; ih++)
                            if (ih >= 0 && ih < H)
                                fill(ring + (long)(ih % span) * row, x, sh, sw, ih, W, PL, act_in);
                        next = ih0 + span;
                        const float *rows[64];
                        for (int kh = 0; kh < KH; kh++) {
                            const int ih = ih0 + kh * DH;
                            rows[kh] = ih >= 0 && ih < H ? ring + (long)(ih % span) * row : zero;
                        }
                        const long at = n * dn + cb * dcb + oh * dh;
                        const float *r_ = res ? res + at : 0;
                        float *y = dst + at;
                        const int count = (OW + UR - 1) / UR; /* tiles of near-equal size */
                        for (int i = 0, ow = 0; i < count; i++) {
                            const int ur = (OW - ow) / (count - i);
                            if (SW == 1) {
                                TILES(1)
                            } else if (SW == 2) {
                                TILES(2)
                            } else {
                                TILES(SW)
                            }
                            ow += ur;
                        }
                    }
                }
        free(ring);
    }
    return failed ? 2 : 0;
}
