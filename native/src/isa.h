// What the kernels of one translation unit may use, from the compiler's target (-m flags):
// ETS_WITH_AMX when the Intel AMX code (attention_amx.cpp, linear_q4_amx.cpp) is built into this
// kernel set. Only on x86-64, and not in the kernel sets for CPUs below AVX-512 (native/Makefile
// defines ETS_NO_AMX for those): there the AMX entry points are stubs that are never called,
// because amx_attention_supported() is false.
#pragma once

#if defined(__x86_64__) && !defined(ETS_NO_AMX)
#define ETS_WITH_AMX 1
#endif

// ETS_NEON when the kernels of this translation unit may use Advanced SIMD (aarch64; native/Makefile
// defines ETS_NO_NEON for the aarch64 scalar tier, the portable loops), and ETS_NEON_DOTPROD when
// they may use the ARMv8.2 int8 dot products too (the dotprod tier: -march=armv8.2-a+dotprod;
// cpu_tiers.cpp runs it only where the CPU reports HWCAP_ASIMDDP).
#if defined(__aarch64__) && defined(__ARM_NEON) && !defined(ETS_NO_NEON)
#define ETS_NEON 1
#if defined(__ARM_FEATURE_DOTPROD)
#define ETS_NEON_DOTPROD 1
#endif
#endif
