/* Dynamic per-tensor quantization of a float32 activation to u8 codes, exactly as the op linear_int8_dynamic's
 * reference semantics quantize its input (gawee/ops/quantized.py: activation_qparams, then
 * clamp(round(x * (1 / scale)) + zero_point, 0, 255)), in two passes: the range (0 included), then the codes.
 *
 * gawee_quantize_u8 returns 0 with the codes, the float32 scale and the zero point; 1 where the input holds a nan
 * or an infinity, or where its range takes ChooseQuantizationParams' special cases (a scale of 0 in float32, one
 * whose inverse overflows, or one below its smallest scale): the caller then quantizes with the reference's own
 * code (rare, and exact by construction). The arithmetic of the common case mirrors the reference step by step:
 * the scale is the range over the levels in double, the zero point chosen and rounded (half to even) in double,
 * the inverse of the float32 scale in float32, each code rounded half to even in float32.
 */
#include <math.h>
#include <stddef.h>

#define LANES 16
#include "vec.h"

#define PARALLEL_FROM (1L << 17) /* elements: below, one thread (a parallel region costs more than it saves) */

static void range(const float *x, long n, float *lo_out, float *hi_out, int *bad_out) {
    float lo = 0.0f, hi = 0.0f;
    int bad = 0;
#pragma omp parallel if (n >= PARALLEL_FROM) reduction(min : lo) reduction(max : hi) reduction(| : bad)
    {
        vf vlo = splat(0.0f), vhi = splat(0.0f);
        vi vbad = (vi){0};
        long blocks = n / LANES;
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            vf v = load(x + b * LANES);
            vi less = v < vlo, more = v > vhi;
            vlo = (vf)(((vi)v & less) | ((vi)vlo & ~less));
            vhi = (vf)(((vi)v & more) | ((vi)vhi & ~more));
            vbad |= (v != v) | (v - v != 0.0f); /* nan, or an infinity (inf - inf is nan) */
        }
        for (int i = 0; i < LANES; i++) {
            lo = vlo[i] < lo ? vlo[i] : lo;
            hi = vhi[i] > hi ? vhi[i] : hi;
            bad |= vbad[i] != 0;
        }
    }
    for (long i = n / LANES * LANES; i < n; i++) {
        float v = x[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        bad |= !(v - v == 0.0f);
    }
    *lo_out = lo;
    *hi_out = hi;
    *bad_out = bad;
}

int gawee_quantize_u8(const float *x, long n, int levels, double small_scale, unsigned char *codes, float *scale_out,
                      int *zero_out) {
    float lo, hi;
    int bad;
    range(x, n, &lo, &hi, &bad);
    if (bad)
        return 1;
    double scale = ((double)hi - (double)lo) / levels;
    float scale_f = (float)scale;
    volatile float inverse = 1.0f / scale_f; /* as torch's reciprocal rounds it, not folded into the loop */
    if (scale_f == 0.0f || isinf(inverse) || scale < small_scale)
        return 1;
    double from_min = -(double)lo / scale, from_max = levels - (double)hi / scale;
    double min_error = -fabs((double)lo / scale), max_error = levels - fabs((double)hi / scale);
    double zero = nearbyint(min_error < max_error ? from_min : from_max);
    zero = zero < 0 ? 0 : zero > levels ? levels : zero;
    float inv = inverse, zero_f = (float)zero;
#pragma omp parallel for if (n >= PARALLEL_FROM) schedule(static)
    for (long i = 0; i < n; i++) {
        float q = rintf(x[i] * inv) + zero_f;
        q = q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q;
        codes[i] = (unsigned char)(int)q;
    }
    *scale_out = scale_f;
    *zero_out = (int)zero;
    return 0;
}
