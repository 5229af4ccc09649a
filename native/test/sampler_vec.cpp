// The sampler's reductions for the test library's own copy of sampler.cpp (native/Makefile:
// sampler_hooks.o): simd.h's, built for this machine like the rest of the test library, where
// libetserve.so takes them from the CPU tier it chose (cpu_tiers.cpp).
#include "kernel_table.h"
#include "simd.h"

namespace etserve::vec {
float max_of(const float* p, int64_t n) { return simd::max_of(p, n); }
double sum_exp_shift(const float* x, int64_t n, float mx) { return simd::sum_exp_shift(x, n, mx); }
double exp_weights(const float* x, float* w, int64_t n, float mx, float s) { return simd::exp_weights(x, w, n, mx, s); }
}  // namespace etserve::vec
