// See kernel_isa.h: what simd.h turned on for the kernels compiled with these flags.
#include "kernel_isa.h"

#include "isa.h"
#include "simd.h"

namespace etserve {

const char* kernel_isa() {
#if defined(ETS_VNNI512)
  return "avx512-vnni";
#elif defined(ETS_AVX512)
  return "avx512";
#elif defined(ETS_AVX2)
  return "avx2";
#elif defined(ETS_NEON_DOTPROD)
  return "neon-dotprod";
#elif defined(ETS_NEON)
  return "neon";
#else
  return "scalar";
#endif
}

}  // namespace etserve
