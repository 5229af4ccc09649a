// etserve::linear_q4 with Advanced SIMD (aarch64): see linear_q4_neon.cpp. Compiled in every
// kernel set (native/Makefile); defined where isa.h sets ETS_NEON (the neon and dotprod tiers).
#pragma once

#include "isa.h"

#include <cstdint>

namespace etserve {

#if defined(ETS_NEON)
// linear_q4's contract (linear_q4.h), the whole of it: quantization, threads, the products.
void linear_q4_neon(const float* x, int64_t M, int64_t K, const uint8_t* weight, const uint16_t* scales,
                    const float* row_sums, const float* bias, int64_t N, float* out);
#endif

}  // namespace etserve
