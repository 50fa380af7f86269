/* Grouped convolution of 8 input and 8 output channels per group, for gawee's oneDNN-primitives runtime
 * (gawee/backend/grouped.py): RegNet's 3x3 convolutions.
 *
 * y[n][8g + k][oh][ow] = act(bias[8g + k] + res[..] + sum_{c<8,kh,kw} x[n][8g + c][ih][iw] * w[8g + k][c][kh][kw]),
 *   ih = oh*SH - PT + kh*DH,  iw = ow*SW - PL + kw*DW  (zero outside the image).
 *
 * Activations are read and written where oneDNN keeps them: element (n, c, h, w) at
 *   n*sn + (c / blk)*scb + h*sh + w*sw + c % blk
 * which is nChw8c / nChw16c (blk 8 / 16) and NHWC (blk = C, scb = 0): a group's 8 channels are contiguous in
 * each. (Lowercase sizes are the layouts' strides in floats, uppercase ones the convolution's.) Per work item
 * (image, group, output row) the KH input rows it reads are first copied into a zero-padded band (a few KB, on
 * the stack, 8 channels per column), so every tile of output pixels reads the band without bounds checks. A tile
 * is UR (up to 12) pixels of the row by the group's 8 output channels: 12 accumulators, the tap's weight vector
 * and one broadcast input value; per input channel and tap, one weight load and UR broadcasts for UR fused
 * multiply-adds. The filters are packed once (grouped.py) as [g][kh][kw][c][8 output channels]. Threads: OpenMP
 * over (image, group, output row), the runtime torch and oneDNN share.
 */
#define LANES 8
#include "vec.h"

enum { UR = 12, BAND = 16384 };
/* Pixels per tile at most; the band's floats at most (grouped.py offers the kernel only where it fits). */

/* ``ur`` output pixels from column ow0 (band column ow0*SW): stride ``sw`` (1 or 2, a constant in each copy). */
static inline __attribute__((always_inline)) void tile(const int ur, const int sw, const float *band, int wb,
                                                        const float *w, int KH, int KW, int DW, int ow0,
                                                        const float *bias, const float *res, float *out, long dw,
                                                        int act) {
    vf acc[UR];
    for (int p = 0; p < ur; p++)
        acc[p] = (vf){0};
    for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) {
            const float *x = band + ((long)kh * wb + (long)ow0 * sw + (long)kw * DW) * 8;
            const float *wt = w + (kh * KW + kw) * 64;
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                const vf wc = load(wt + 8 * c);
                _Pragma("GCC unroll 12") for (int p = 0; p < ur; p++) acc[p] += splat(x[c + p * sw * 8]) * wc;
            }
        }
    const vf b = load(bias);
    for (int p = 0; p < ur; p++) {
        vf v = acc[p] + b;
        if (res)
            v += load(res + (ow0 + p) * dw);
        if (act == 1)
            v = relu_mask(v);
        store(out + (ow0 + p) * dw, v);
    }
}

#define TILES(sw)                                                                                                  \
    switch (ur) {                                                                                                  \
        CASE(1, sw) CASE(2, sw) CASE(3, sw) CASE(4, sw) CASE(5, sw) CASE(6, sw) CASE(7, sw) CASE(8, sw)            \
        CASE(9, sw) CASE(10, sw) CASE(11, sw) CASE(12, sw) default : break;                                         \
    }
#define CASE(r, sw)                                                                                                \
    case r:                                                                                                        \
        tile(r, sw, band, wb, w, KH, KW, DW, ow, bias + 8 * g, res ? res + at : 0, dst + at, dw, act);         \
        break;

/* Where channel c is within a pixel's. */
static inline long chan(long scb, int blk, int c) { return (long)(c / blk) * scb + c % blk; }

int gawee_group8_conv(const float *src, const float *wp, const float *bias, const float *res, float *dst, int N,
                      int G, int H, int W, long sn, long scb, long sh, long sw, int blk, int OH, int OW, long dn,
                      long dcb, long dh, long dw, int dblk, int KH, int KW, int SH, int SW, int PT, int PL, int DH,
                      int DW, int act) {
    const int wb = (OW - 1) * SW + (KW - 1) * DW + 1; /* the band's columns: iw = column - PL */
    if ((SW != 1 && SW != 2) || (act != 0 && act != 1) || (long)KH * wb * 8 > BAND || blk % 8 || dblk % 8)
        return 1;
    const int count = (OW + UR - 1) / UR; /* tiles per row, of near-equal size */
#pragma omp parallel for collapse(3) schedule(static)
    for (int n = 0; n < N; n++)
        for (int g = 0; g < G; g++)
            for (int oh = 0; oh < OH; oh++) {
                float band[BAND] __attribute__((aligned(32)));
                const float *plane = src + n * sn + chan(scb, blk, 8 * g);
                for (int kh = 0; kh < KH; kh++) { /* the rows this output row reads, zero outside the image */
                    const int ih = oh * SH - PT + kh * DH;
                    float *r = band + (long)kh * wb * 8;
                    for (int j = 0; j < wb; j++) {
                        const int iw = j - PL;
                        store(r + 8 * j, ih >= 0 && ih < H && iw >= 0 && iw < W
                                             ? load(plane + ih * sh + iw * sw)
                                             : (vf){0});
                    }
                }
                const float *w = wp + (long)g * KH * KW * 64;
                const long at = n * dn + chan(dcb, dblk, 8 * g) + oh * dh;
                for (int i = 0, ow = 0; i < count; i++) {
                    const int ur = (OW - ow) / (count - i);
                    if (SW == 1) {
                        TILES(1)
                    } else {
                        TILES(2)
                    }
                    ow += ur;
                }
            }
    return 0;
}
