/* Static quantization of a float32 NCHW tensor into u8 codes held channels-last (NHWC), for gawee's
 * oneDNN-primitives runtime (gawee/backend/quantize_nhwc.py): an int8 network's input image quantized for its stem
 * convolution (rules/precision/int8.rules: conv2d_int8_static).
 *
 * dst[n, p, c] = code(src[n, c, p]) over the pixels p of each image, where code(x) computes what oneDNN's scaled
 * reorder computes, step for step in float32: x times the inverse scale, plus the zero point, saturated to
 * [0, 255] (a nan to 0), rounded to the nearest integer, ties to even. The source's address is read through a
 * pointer (src_at): a graph input's changes with each call. Pixels are taken 64 at a time, each block's channel
 * rows read from their planes and written interleaved; three channels (an image) get a loop the compiler unrolls.
 * Threads: OpenMP, the runtime torch and oneDNN share (blocks of pixels split between them).
 */

#define ROUNDER 12582912.0f /* 1.5 * 2^23: (v + ROUNDER) - ROUNDER is v in [0, 255] rounded to nearest, ties to even */
#define BLOCK 64

static inline unsigned char code(float x, float inverse, float zero_point) {
    float v = x * inverse;
    v = v + zero_point;        /* separate statements: never fused into one multiply-add */
    v = v > 0.0f ? v : 0.0f;   /* a nan compares false: 0 */
    v = v < 255.0f ? v : 255.0f;
    v = (v + ROUNDER) - ROUNDER;
    return (unsigned char)(int)v;
}

static inline void block(const float *src, unsigned char *dst, long C, long HW, long p0, long p1, float inverse,
                         float zero_point) {
    for (long p = p0; p < p1; p++)
        for (long c = 0; c < C; c++) dst[p * C + c] = code(src[c * HW + p], inverse, zero_point);
}

int gawee_quantize_nhwc_u8(const float *const *src_at, unsigned char *dst, long N, long C, long HW, float inverse,
                           float zero_point) {
    const float *src = *src_at;
    long blocks = (HW + BLOCK - 1) / BLOCK;
#pragma omp parallel for collapse(2) schedule(static) if (N * C * HW >= 65536)
    for (long n = 0; n < N; n++)
        for (long b = 0; b < blocks; b++) {
            const float *s = src + n * C * HW;
            unsigned char *d = dst + n * HW * C;
            long p0 = b * BLOCK, p1 = p0 + BLOCK < HW ? p0 + BLOCK : HW;
            if (C == 3 && p1 - p0 == BLOCK)
                block(s, d, 3, HW, p0, p0 + BLOCK, inverse, zero_point);
            else
                block(s, d, C, HW, p0, p1, inverse, zero_point);
        }
    return 0;
}
