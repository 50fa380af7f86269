/* Max pooling of u8 codes held channels-last (NHWC), for gawee's oneDNN-primitives runtime
 * (gawee/backend/pool_u8.py): an int8 network's stem max pool reads the codes its convolution wrote
 * (rules/precision/int8.rules, requantize_through_max_pool) and writes the codes the next convolution reads.
 *
 * dst[n, y, x, c] = max of src[n, y*sh - ph + ky*dh, x*sw - pw + kx*dw, c] over the window positions inside the
 * image; the caller guarantees each window has one (torch's padding is at most half the window), so the padding
 * never wins. The channels of a pixel are contiguous: the innermost loop is a vector max of bytes.
 * Threads: OpenMP, the runtime torch and oneDNN share (rows of the output split between them).
 */

#include <string.h>

int gawee_max_pool_u8(const unsigned char *src, unsigned char *dst, long N, long C, long H, long W, long OH,
                      long OW, long kh, long kw, long sh, long sw, long ph, long pw, long dh, long dw) {
#pragma omp parallel for collapse(2) schedule(static) if (N * OH * OW * C >= 65536)
    for (long n = 0; n < N; n++)
        for (long y = 0; y < OH; y++)
            for (long x = 0; x < OW; x++) {
                unsigned char *o = dst + ((n * OH + y) * OW + x) * C;
                memset(o, 0, (size_t)C);
                for (long ky = 0; ky < kh; ky++) {
                    long iy = y * sh - ph + ky * dh;
                    if (iy < 0 || iy >= H) continue;
                    for (long kx = 0; kx < kw; kx++) {
                        long ix = x * sw - pw + kx * dw;
                        if (ix < 0 || ix >= W) continue;
                        const unsigned char *i = src + ((n * H + iy) * W + ix) * C;
#pragma omp simd
                        for (long c = 0; c < C; c++) o[c] = o[c] > i[c] ? o[c] : i[c];
                    }
                }
            }
    return 0;
}
