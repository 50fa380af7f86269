/* The vectors gawee's C kernels compute on (GCC's and Clang's vector extension; -march=native picks the
 * instructions), shared by depthwise.c, grouped.c and winograd.c. A kernel defines LANES before including it: 8
 * (a 256-bit register), or 16 where the CPU has AVX-512 (depthwise.c). It gets:
 *   vf, vi        LANES floats, LANES ints (a comparison's mask);
 *   load, store   LANES floats from or to any address (through memcpy: no alignment asked; one move);
 *   splat         one float in every lane;
 *   relu_mask     v where v > 0, else 0 (by the comparison's mask: nan becomes 0).
 * native.py digests this header with each source that includes it: a change rebuilds them.
 */
#ifndef GAWEE_VEC_H
#define GAWEE_VEC_H

#include <string.h>

#ifndef LANES
#error "define LANES (floats per vector) before including vec.h"
#endif

typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int vi __attribute__((vector_size(4 * LANES)));

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf splat(float f) { return (vf){0} + f; }

static inline vf relu_mask(vf v) { return (vf)((vi)v & (v > 0.0f)); }

#endif
