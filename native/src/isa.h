// What the kernels of one translation unit may use, from the compiler's target (-m flags):
// ETS_WITH_AMX when the Intel AMX code (attention_amx.cpp, linear_q4_amx.cpp) is built into this
// kernel set. Only on x86-64, and not in the kernel sets for CPUs below AVX-512 (native/Makefile
// defines ETS_NO_AMX for those): there the AMX entry points are stubs that are never called,
// because amx_attention_supported() is false.
#pragma once

#if defined(__x86_64__) && !defined(ETS_NO_AMX)
#define ETS_WITH_AMX 1
#endif
