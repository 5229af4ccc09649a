// The CPU tiers: which of the kernel sets native/Makefile built (kernel_table.h) this process
// runs, chosen once from what the CPU has and the OS saves (cpuid, xgetbv), and the etserve
// kernel entry points the rest of the library calls, forwarded to that set. Compiled for the
// baseline of the architecture (x86-64: SSE2), like everything outside the kernel sets, so that
// any CPU gets this far and picks the set it can run.
//
// x86-64 tiers (ETSERVE_ISA forces a lower one, e.g. to test it on a bigger CPU):
//   avx512  x86-64-v4 + AVX512-VNNI + AVX512-VBMI (Ice Lake, Zen 4 and later); with AMX-INT8/BF16
//           (Sapphire Rapids and later) the same set runs the AMX tiles too ("amx", the default
//           there; ETSERVE_ISA=avx512 keeps them off)
//   avx2    x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE (Haswell, Zen 1 and later)
//   scalar  x86-64: the portable loops
//
// aarch64 tiers (from the kernel's hardware capabilities, getauxval(AT_HWCAP); ETSERVE_ISA forces
// a lower one the same way):
//   neon-dotprod  ARMv8.2-A dot products (HWCAP_ASIMDDP: SDOT/UDOT; Cortex-A55/A75, Neoverse N1,
//                 Apple M1, Graviton 2 and later): the dotprod kernel set
//   neon          Advanced SIMD (HWCAP_ASIMD: every aarch64 Linux CPU, e.g. Cortex-A53/A72)
//   scalar        the portable loops
#include "kernel_table.h"

#include "attention.h"
#include "attention_amx.h"
#include "attention_decode.h"
#include "kernel_isa.h"
#include "linear_q4.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace etserve {

namespace {

#if defined(__x86_64__)
enum Tier { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };
const char* const kTierNames[] = {"scalar", "avx2", "avx512", "amx"};

void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

// The highest kernel set this CPU and OS run (AMX is the avx512 set's own check, attention.cpp).
Tier detect() {
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  if (max_leaf < 7) return kScalar;
  cpuid(1, 0, r);
  const unsigned c1 = r[2];
  const bool sse3 = c1 & 1u, ssse3 = c1 & (1u << 9), fma = c1 & (1u << 12), cx16 = c1 & (1u << 13),
             sse41 = c1 & (1u << 19), sse42 = c1 & (1u << 20), movbe = c1 & (1u << 22),
             popcnt = c1 & (1u << 23), osxsave = c1 & (1u << 27), avx = c1 & (1u << 28),
             f16c = c1 & (1u << 29);
  cpuid(0x80000000u, 0, r);
  bool lahf = false, lzcnt = false;
  if (r[0] >= 0x80000001u) {
    cpuid(0x80000001u, 0, r);
    lahf = r[2] & 1u, lzcnt = r[2] & (1u << 5);
  }
  cpuid(7, 0, r);
  const unsigned b7 = r[1], c7 = r[2];
  const bool bmi1 = b7 & (1u << 3), avx2 = b7 & (1u << 5), bmi2 = b7 & (1u << 8),
             avx512f = b7 & (1u << 16), avx512dq = b7 & (1u << 17), avx512cd = b7 & (1u << 28),
             avx512bw = b7 & (1u << 30), avx512vl = b7 & (1u << 31), vbmi = c7 & (1u << 1),
             vnni = c7 & (1u << 11);
  if (!osxsave) return kScalar;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const bool os_avx = (lo & 0x6u) == 0x6u;       // XMM and YMM state
  const bool os_avx512 = (lo & 0xE6u) == 0xE6u;  // and opmask, ZMM_Hi256, Hi16_ZMM
  const bool v2 = sse3 && ssse3 && sse41 && sse42 && popcnt && cx16 && lahf;
  const bool v3 = v2 && avx && avx2 && fma && f16c && bmi1 && bmi2 && lzcnt && movbe && os_avx;
  if (!v3) return kScalar;
  const bool v4 = avx512f && avx512dq && avx512cd && avx512bw && avx512vl && os_avx512;
  if (!(v4 && vnni && vbmi)) return kAvx2;
  return kAvx512;
}

const EtsKernelTable* choose() {
  const Tier best = detect();
  Tier want = best;
  const char* env = std::getenv("ETSERVE_ISA");
  if (env != nullptr && *env != '\0' && std::strcmp(env, "native") != 0) {
    int w = -1;
    for (int t = kScalar; t <= kAmx; ++t)
      if (std::strcmp(env, kTierNames[t]) == 0) w = t;
    if (w < 0) {
      std::fprintf(stderr, "etserve: ETSERVE_ISA=%s is none of scalar, avx2, avx512, amx: using %s\n", env,
                   kTierNames[best]);
    } else if (w == kAmx ? best < kAvx512 : w > best) {
      std::fprintf(stderr, "etserve: ETSERVE_ISA=%s: this CPU or OS lacks it; using %s\n", env, kTierNames[best]);
    } else {
      want = static_cast<Tier>(w == kAmx ? kAvx512 : w);
    }
  }
  switch (want) {
    case kAvx512:
    case kAmx:
      return &ets_kernels_avx512;
    case kAvx2:
      return &ets_kernels_avx2;
    default:
      return &ets_kernels_scalar;
  }
}
#elif defined(__aarch64__)
enum Tier { kScalar = 0, kNeon = 1, kDotprod = 2 };
const char* const kTierNames[] = {"scalar", "neon", "neon-dotprod"};

Tier detect() {
#if defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP);
  const unsigned long kAsimd = 1ul << 1, kAsimdDp = 1ul << 20;  // HWCAP_ASIMD, HWCAP_ASIMDDP
  if (!(hw & kAsimd)) return kScalar;
  return (hw & kAsimdDp) ? kDotprod : kNeon;
#else
  return kNeon;  // Advanced SIMD is part of ARMv8-A
#endif
}

const EtsKernelTable* choose() {
  const Tier best = detect();
  Tier want = best;
  const char* env = std::getenv("ETSERVE_ISA");
  if (env != nullptr && *env != '\0' && std::strcmp(env, "native") != 0) {
    int w = -1;
    for (int t = kScalar; t <= kDotprod; ++t)
      if (std::strcmp(env, kTierNames[t]) == 0) w = t;
    if (std::strcmp(env, "dotprod") == 0) w = kDotprod;
    if (w < 0) {
      std::fprintf(stderr, "etserve: ETSERVE_ISA=%s is none of scalar, neon, neon-dotprod: using %s\n", env,
                   kTierNames[best]);
    } else if (w > best) {
      std::fprintf(stderr, "etserve: ETSERVE_ISA=%s: this CPU or OS lacks it; using %s\n", env, kTierNames[best]);
    } else {
      want = static_cast<Tier>(w);
    }
  }
  switch (want) {
    case kDotprod:
      return &ets_kernels_dotprod;
    case kNeon:
      return &ets_kernels_neon;
    default:
      return &ets_kernels_scalar;
  }
}
#else
const EtsKernelTable* choose() { return &ets_kernels_generic; }
#endif

}  // namespace

const EtsKernelTable& kernels() {
  static const EtsKernelTable* const t = choose();
  return *t;
}

const char* kernel_isa() { return kernels().isa(); }

void run_attention(const AttnArgs& a) { kernels().run_attention(&a); }

int attention_kernel(int want) { return kernels().attention_kernel(want); }

bool amx_attention_supported() { return kernels().amx_supported(); }

bool decode_reads_tiles() { return kernels().decode_reads_tiles(); }

Tensor& linear_q4_out(KernelRuntimeContext& ctx, const Tensor& input, const Tensor& weight, const Tensor& scales,
                      const Tensor& row_sums, const std::optional<Tensor>& bias, Tensor& out) {
  return kernels().linear_q4_out(ctx, input, weight, scales, row_sums, bias, out);
}

void linear_q4(const float* x, int64_t M, int64_t K, const uint8_t* weight, const uint16_t* scales,
               const float* row_sums, const float* bias, int64_t N, float* out) {
  kernels().linear_q4(x, M, K, weight, scales, row_sums, bias, N, out);
}

namespace vec {
float max_of(const float* p, int64_t n) { return kernels().max_of(p, n); }
double sum_exp_shift(const float* x, int64_t n, float mx) { return kernels().sum_exp_shift(x, n, mx); }
double exp_weights(const float* x, float* w, int64_t n, float mx, float s) {
  return kernels().exp_weights(x, w, n, mx, s);
}
}  // namespace vec

}  // namespace etserve
