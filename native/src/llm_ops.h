/*
 * etserve's own kernels for the ExecuTorch LLM custom operators
 * (`llama::update_cache.out`, `llama::custom_sdpa.out`,
 * `llama::sdpa_with_kv_cache.out`), registered with the runtime's kernel
 * registry by a static initializer of llm_ops.cpp when libetserve.so loads.
 *
 * fp32 only for attention (fp16/bf16 are refused with a logged error and a
 * failed kernel call); update_cache copies any dtype as long as value and
 * cache agree.
 */
#ifndef ETSERVE_LLM_OPS_H
#define ETSERVE_LLM_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ETS_LLM_OPS_API __attribute__((visibility("default")))

/* Operators registered by this library: count, and name i ("llama::custom_sdpa.out"),
 * NULL when i is out of range. For a model-open check that every operator a
 * .pte names has a kernel, prefer the runtime's own registry lookup. */
ETS_LLM_OPS_API int etserve_llm_op_count(void);
ETS_LLM_OPS_API const char* etserve_llm_op_name(int i);
/* 1 if the registration at load time succeeded for all of them. */
ETS_LLM_OPS_API int etserve_llm_ops_registered(void);

/* Test entry points: wrap raw contiguous fp32 buffers into tensors and call
 * the very kernels the registry uses. Return 0 on success, else the
 * ExecuTorch error code the kernel failed with.
 *   q, out: [B, S, H, D]; caches: [B, S_max, H_kv, D]
 *   mask: NULL or [S, S_max] additive (only with is_causal == 0)
 *   scale <= 0: 1/sqrt(D) */
ETS_LLM_OPS_API int etserve_test_custom_sdpa(
    const float* q, int B, int S, int H, int D, const float* k_cache,
    const float* v_cache, int S_max, int H_kv, int64_t start_pos,
    int is_causal, const float* mask, float scale, float* out);

/* value: [B, S, H_kv, D] -> cache [B, S_max, H_kv, D] rows start_pos.. */
ETS_LLM_OPS_API int etserve_test_update_cache(
    const float* value, int B, int S, int H_kv, int D, float* cache, int S_max,
    int64_t start_pos);

/* The fused legacy op: k, v [B, S, H_kv, D] written into the caches, then
 * attention as custom_sdpa. mask: NULL or [S, S_max]. */
ETS_LLM_OPS_API int etserve_test_sdpa_with_kv_cache(
    const float* q, const float* k, const float* v, int B, int S, int H,
    int D, float* k_cache, float* v_cache, int S_max, int H_kv,
    int64_t start_pos, int is_causal, const float* mask, float scale,
    float* out);

/* Calls custom_sdpa.out with tensors of ScalarType `dtype` (e.g. 5 Half,
 * 15 BFloat16) over a zeroed scratch buffer; returns the kernel's error code
 * (expected non-zero for anything but Float). */
ETS_LLM_OPS_API int etserve_test_custom_sdpa_dtype(int dtype);

#ifdef __cplusplus
}
#endif

#endif /* ETSERVE_LLM_OPS_H */
