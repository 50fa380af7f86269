/* A per-channel affine map and ReLU applied while concatenating along channels, for gawee's oneDNN-primitives
 * runtime (gawee/backend/affine_cat.py): dst = act(scale[c] * cat(parts, dim=1)[c] + shift[c]).
 *
 * One pass over the parts instead of two (oneDNN's concatenation, then the batch norm reading its result):
 * DenseNet's every layer is cat -> batch norm -> ReLU -> 1x1 convolution.
 *
 * Layouts: blk > 0 is nChw{blk}c (oneDNN's blocked layout; every part's channels a multiple of blk), element
 * (n, c, p) of a tensor of C channels at n*C*P + (c / blk)*P*blk + p*blk + c % blk, p = h*W + w;
 * blk == 0 is NHWC, at (n*P + p)*C + c. Threads: OpenMP, the runtime torch and oneDNN share.
 */

int gawee_affine_cat(const float *const *parts, const int *channels, int nparts, float *dst, const float *scale,
                     const float *shift, int relu, int N, long P, int blk) {
    int C = 0;
    for (int j = 0; j < nparts; j++) C += channels[j];
    if (blk > 0) {
        int nb = C / blk;
#pragma omp parallel for collapse(2) schedule(static)
        for (int n = 0; n < N; n++)
            for (int b = 0; b < nb; b++) {
                int c0 = b * blk, j = 0, first = 0; /* the part holding channel c0, and its first channel */
                while (c0 >= first + channels[j]) first += channels[j++];
                const float *s = parts[j] + (long)n * channels[j] * P + (long)(c0 - first) * P;
                float *d = dst + (long)n * C * P + (long)c0 * P;
                const float *a = scale + c0, *t = shift + c0;
                for (long p = 0; p < P; p++) {
#pragma omp simd
                    for (int l = 0; l < blk; l++) {
                        float y = a[l] * s[p * blk + l] + t[l];
                        d[p * blk + l] = relu && y < 0.0f ? 0.0f : y;
                    }
                }
            }
    } else {
#pragma omp parallel for schedule(static)
        for (long q = 0; q < (long)N * P; q++) {
            float *d = dst + q * C;
            for (int j = 0, first = 0; j < nparts; first += channels[j++]) {
                const float *s = parts[j] + q * channels[j];
                const float *a = scale + first, *t = shift + first;
#pragma omp simd
                for (int c = 0; c < channels[j]; c++) {
                    float y = a[c] * s[c] + t[c];
                    d[first + c] = relu && y < 0.0f ? 0.0f : y;
                }
            }
        }
    }
    return 0;
}
