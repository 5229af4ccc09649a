// This tier's kernel table (kernel_table.h). Compiled with the tier's flags and namespace
// (native/Makefile: -Detserve=etserve_<tier> -DETS_TIER=<tier>), like the kernels it points to.
#include "kernel_table.h"

// GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -W(maybe-)uninitialized reports where simd.h's reductions are instantiated.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "attention.h"
#include "attention_amx.h"
#include "attention_decode.h"
#include "kernel_isa.h"
#include "linear_q4.h"
#include "simd.h"

#ifndef ETS_TIER
#error "ETS_TIER: the tier this kernel set is compiled for (native/Makefile)"
#endif
#define ETS_CAT2(a, b) a##b
#define ETS_CAT(a, b) ETS_CAT2(a, b)

extern const EtsKernelTable ETS_CAT(ets_kernels_, ETS_TIER) = {
    etserve::kernel_isa,
    [](const void* a) { etserve::run_attention(*static_cast<const etserve::AttnArgs*>(a)); },
    etserve::attention_kernel,
    etserve::amx_attention_supported,
    etserve::decode_reads_tiles,
    etserve::linear_q4_out,
    etserve::linear_q4,
    etserve::simd::max_of,
    etserve::simd::sum_exp_shift,
    etserve::simd::exp_weights,
};
