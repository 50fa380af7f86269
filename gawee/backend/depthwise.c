/* Depthwise convolution (one input and one output channel per group), for gawee's oneDNN-primitives runtime
 * (gawee/backend/depthwise.py): MobileNet's and EfficientNet's k x k depthwise convolutions with their activation.
 *
 * y[n][c][oh][ow] = act(bias[c] + res[..] + sum_{kh,kw} x[n][c][ih][iw] * w[c][kh][kw]),
 *   ih = oh*SH - PT + kh*DH,  iw = ow*SW - PL + kw*DW  (zero outside the image).
 *
 * A vector holds V channels (16 where the CPU has AVX-512, else 8): channel chunk cb of pixel (n, h, w) is the V
 * floats at n*sn + cb*scb + h*sh + w*sw, which is nChw16c / nChw8c (the block is V: scb = H*W*V, sw = V) and NHWC
 * (scb = V, sw = C). Per work item (image, chunk, output row), the output pixels whose window lies inside the
 * image's columns are computed in tiles of UR pixels (UR accumulators; each tap's weight vector loaded once per
 * tile), the few at the borders one by one with bounds checks; rows outside the image are skipped. The filters
 * are packed once (depthwise.py) as [cb][kh][kw][V], zero past the channels, so a blocked layout's padding
 * lanes come out act(0) = 0 for the activations offered. The epilogue adds the bias and a residual and applies
 * ReLU, SiLU (x / (1 + e^-x), e^x by Cody-Waite reduction and Cephes' polynomial, rel. error < 2e-7) or
 * hardswish. Threads: OpenMP over (image, chunk, output row), the runtime torch and oneDNN share.
 */
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
enum { V = 16 };
#else
enum { V = 8 };
#endif

typedef float vf __attribute__((vector_size(4 * V)));
typedef int vi __attribute__((vector_size(4 * V)));

enum { UR = 8 };

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf splat(float f) { return (vf){0} + f; }

static inline vf vmax(vf a, vf b) { return (vf)(((vi)a & (a > b)) | ((vi)b & ~(a > b))); }

static inline vf vmin(vf a, vf b) { return (vf)(((vi)a & (a < b)) | ((vi)b & ~(a < b))); }

/* e^x for x in [-87, 88] (clamped there): x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' expf polynomial. */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const vf n = (x * 1.44269504088896341f + magic) - magic;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const vi scale = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)scale;
}

/* 1 / d for d >= 1: the CPU's reciprocal estimate and one Newton step (rel. error < 1e-7 from AVX-512's 14-bit
 * estimate, < 3e-7 from AVX's 12-bit one), a few cycles against a division's ten or more. */
static inline vf reciprocal(vf d) {
#if defined(__AVX512F__)
    const vf r = (vf)_mm512_rcp14_ps((__m512)d);
#elif defined(__AVX__)
    const vf r = (vf)_mm256_rcp_ps((__m256)d);
#else
    return 1.0f / d;
#endif
#if defined(__AVX512F__) || defined(__AVX__)
    return r * (2.0f - d * r);
#endif
}

static inline vf activate(vf v, int act) {
    switch (act) {
    case 1:
        return vmax(v, (vf){0});
    case 2:
        return v * reciprocal(1.0f + vexp(-v));
    case 3:
        return v * vmin(vmax(v * (1.0f / 6) + 0.5f, (vf){0}), splat(1.0f));
    default:
        return v;
    }
}

/* ``ur`` output pixels from column ow whose windows lie inside the image's columns; ``sw`` a constant per copy. */
static inline __attribute__((always_inline)) void tile(const int ur, const float *x, long sh, long sw, const float *w,
                                                        int kh0, int kh1, int ih0, int KW, int SW, int DH, int DW,
                                                        int PL, int ow, vf b, const float *res, float *y, long dw,
                                                        int act) {
    vf acc[UR];
    for (int p = 0; p < ur; p++)
        acc[p] = b;
    for (int kh = kh0; kh < kh1; kh++) {
        const float *row = x + (ih0 + kh * DH) * sh + (long)(ow * SW - PL) * sw;
        for (int kw = 0; kw < KW; kw++) {
            const vf wv = load(w + (kh * KW + kw) * V);
            const float *at = row + (long)kw * DW * sw;
            _Pragma("GCC unroll 8") for (int p = 0; p < ur; p++) acc[p] += load(at + (long)p * SW * sw) * wv;
        }
    }
    for (int p = 0; p < ur; p++) {
        vf v = acc[p];
        if (res)
            v += load(res + (ow + p) * dw);
        store(y + (ow + p) * dw, activate(v, act));
    }
}

/* One output pixel at column ow, checking each tap's column; a partial sum per kernel row, so the multiply-adds
 * are not one chain. */
static inline void border(const float *x, long sh, long sw, const float *w, int kh0, int kh1, int ih0, int W, int KW,
                          int SW, int DH, int DW, int PL, int ow, vf b, const float *res, float *y, long dw, int act) {
    vf even = b, odd = {0};
    for (int kh = kh0; kh < kh1; kh++) {
        vf row = {0};
        for (int kw = 0; kw < KW; kw++) {
            const int iw = ow * SW - PL + kw * DW;
            if (iw >= 0 && iw < W)
                row += load(x + (ih0 + kh * DH) * sh + iw * sw) * load(w + (kh * KW + kw) * V);
        }
        if (kh & 1)
            odd += row;
        else
            even += row;
    }
    vf v = even + odd;
    if (res)
        v += load(res + ow * dw);
    store(y + ow * dw, activate(v, act));
}

/* The tile of ``ur`` pixels (a constant in each copy: its accumulators stay in registers) at stride ``sw``. */
#define TILES(sw)                                                                                                  \
    switch (ur) {                                                                                                  \
        CASE(1, sw) CASE(2, sw) CASE(3, sw) CASE(4, sw) CASE(5, sw) CASE(6, sw) CASE(7, sw) CASE(8, sw)            \
        default : break;                                                                                           \
    }
#define CASE(r, sw)                                                                                                \
    case r:                                                                                                        \
        tile(r, x, sh, sw_, w, kh0, kh1, ih0, KW, sw, DH, DW, PL, ow, b, r_, y, dw, act);                          \
        break;

int gawee_depthwise_width(void) { return V; }

int gawee_depthwise_conv(const float *src, const float *wp, const float *bias, const float *res, float *dst, int N,
                         int CB, int H, int W, long sn, long scb, long sh, long sw, int OH, int OW, long dn, long dcb,
                         long dh, long dw, int KH, int KW, int SH, int SW, int PT, int PL, int DH, int DW, int act) {
    if (act < 0 || act > 3 || SH < 1 || SW < 1 || DH < 1 || DW < 1)
        return 1;
    /* the columns whose windows lie inside the image: ow*SW - PL >= 0 and ow*SW - PL + (KW-1)*DW <= W-1 */
    int lo = (PL + SW - 1) / SW, hi = W - 1 - (KW - 1) * DW + PL;
    hi = hi < 0 ? -1 : hi / SW;
    if (hi > OW - 1)
        hi = OW - 1;
    if (lo > hi + 1)
        lo = hi + 1;
#pragma omp parallel for collapse(3) schedule(static)
    for (int n = 0; n < N; n++)
        for (int cb = 0; cb < CB; cb++)
            for (int oh = 0; oh < OH; oh++) {
                const float *x = src + n * sn + cb * scb, *w = wp + (long)cb * KH * KW * V;
                const long at = n * dn + cb * dcb + oh * dh;
                const float *r = res ? res + at : 0;
                float *y = dst + at;
                const vf b = load(bias + cb * V);
                const int ih0 = oh * SH - PT; /* rows outside the image are skipped: kh in [kh0, kh1) */
                int kh0 = 0, kh1 = KH;
                while (kh0 < KH && ih0 + kh0 * DH < 0)
                    kh0++;
                while (kh1 > kh0 && ih0 + (kh1 - 1) * DH >= H)
                    kh1--;
                const float *r_ = r;
                const long sw_ = sw;
                int ow = 0;
                for (; ow < lo && ow < OW; ow++)
                    border(x, sh, sw, w, kh0, kh1, ih0, W, KW, SW, DH, DW, PL, ow, b, r, y, dw, act);
                const int count = (hi + 1 - ow + UR - 1) / UR; /* tiles of the inside columns, of near-equal size */
                for (int i = 0; i < count; i++) {
                    const int ur = (hi + 1 - ow) / (count - i);
                    if (SW == 1) {
                        TILES(1)
                    } else if (SW == 2) {
                        TILES(2)
                    } else {
                        TILES(SW)
                    }
                    ow += ur;
                }
                for (; ow < OW; ow++)
                    border(x, sh, sw, w, kh0, kh1, ih0, W, KW, SW, DH, DW, PL, ow, b, r, y, dw, act);
            }
    return 0;
}
