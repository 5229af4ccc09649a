// One CPU tier's kernels (native/Makefile compiles the kernel sources once per tier, each with
// its instruction-set flags and its own namespace, etserve_<tier>; tier_entry.cpp fills this
// table for the tier). cpu_tiers.cpp picks one table at load from what the CPU and OS support.
#pragma once

#include <executorch/runtime/kernel/kernel_includes.h>

#include <cstdint>
#include <optional>

struct EtsKernelTable {
  const char* (*isa)();  // kernel_isa(): "avx512-vnni", "avx2", "neon-dotprod", "neon", "scalar", ...
  void (*run_attention)(const void* args);  // const etserve::AttnArgs*
  int (*attention_kernel)(int want);
  bool (*amx_supported)();
  bool (*decode_reads_tiles)();  // attention_decode.h
  executorch::aten::Tensor& (*linear_q4_out)(executorch::runtime::KernelRuntimeContext& ctx,
                                             const executorch::aten::Tensor& input,
                                             const executorch::aten::Tensor& weight,
                                             const executorch::aten::Tensor& scales,
                                             const executorch::aten::Tensor& row_sums,
                                             const std::optional<executorch::aten::Tensor>& bias,
                                             executorch::aten::Tensor& out);
  void (*linear_q4)(const float* x, int64_t M, int64_t K, const uint8_t* weight, const uint16_t* scales,
                    const float* row_sums, const float* bias, int64_t N, float* out);
  // the sampler's reductions over a vocabulary (simd.h)
  float (*max_of)(const float* p, int64_t n);
  double (*sum_exp_shift)(const float* x, int64_t n, float mx);
  double (*exp_weights)(const float* x, float* w, int64_t n, float mx, float s);
};

// The tables native/Makefile builds for this architecture (x86-64: scalar, avx2, avx512;
// aarch64: scalar, neon, dotprod; elsewhere: generic).
#if defined(__x86_64__)
extern const EtsKernelTable ets_kernels_scalar, ets_kernels_avx2, ets_kernels_avx512;
#elif defined(__aarch64__)
extern const EtsKernelTable ets_kernels_scalar, ets_kernels_neon, ets_kernels_dotprod;
#else
extern const EtsKernelTable ets_kernels_generic;
#endif

namespace etserve {

// The table chosen for this process (first call: detection, $ETSERVE_ISA, one log line when the
// requested tier is not available).
const EtsKernelTable& kernels();

// The sampler's reductions, through kernels() (sampler.cpp).
namespace vec {
float max_of(const float* p, int64_t n);
double sum_exp_shift(const float* x, int64_t n, float mx);
double exp_weights(const float* x, float* w, int64_t n, float mx, float s);
}  // namespace vec

}  // namespace etserve
