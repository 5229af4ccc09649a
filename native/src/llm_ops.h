/*
 * etserve's own kernels for the ExecuTorch LLM custom operators
 * (`llama::update_cache.out`, `llama::custom_sdpa.out`,
 * `llama::sdpa_with_kv_cache.out`, `llama::custom_quantized_sdpa.out`), and for
 * our own 4-bit linear (`etserve::linear_q4.out`, which app/models/linear_q4.py
 * exports), registered with the runtime's kernel registry by a static
 * initializer of llm_ops.cpp when libetserve.so loads (the kernels themselves:
 * llm_kernels.h, attention.h, linear_q4.h).
 *
 * Attention over fp32, or int8 with per-token scales and zero points
 * (custom_quantized_sdpa); fp16/bf16 are refused with a logged error and a
 * failed kernel call. update_cache copies any dtype as long as value and
 * cache agree.
 */
#ifndef ETSERVE_LLM_OPS_H
#define ETSERVE_LLM_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nothing is exported from here: libetserve.so exports only etserve.h's
 * functions. The test library lists the registered operators
 * (etserve_llm_op_count, etserve_llm_op_name, etserve_llm_ops_registered). */

/* Test entry points that call these kernels live in a separate library,
 * build/libetserve_test.so (native/test/llm_ops_test.cpp). */

#ifdef __cplusplus
}
#endif

#endif /* ETSERVE_LLM_OPS_H */
