// etserve's kernels for ExecuTorch's LLM custom operators, unboxed and
// validated: llm_ops.cpp registers boxed wrappers of these with the runtime,
// so that .pte files exported with `use_sdpa_with_kv_cache=True` run without
// the torch-linked libcustom_ops_aot_lib.
//
// Semantics (checked against the wheel's own kernels):
//   update_cache(value [B,S,Hkv,D], cache [B,Smax,Hkv,D], start_pos):
//     cache[:, start_pos:start_pos+S] = value, in place; `out` is untouched.
//   custom_sdpa(q [B,S,H,D], k_cache, v_cache [B,Smax,Hkv,D], start_pos,
//               attn_mask, dropout (ignored), is_causal, scale):
//     without a mask, keys 0 .. start_pos+S-1 are visible; with is_causal,
//     query row i (absolute position start_pos+i) sees keys 0..start_pos+i.
//     With a mask ([S, Smax] additive float), every cache row is visible and
//     the mask decides; a mask together with is_causal is refused.
//     Query head h reads kv head h / (H/Hkv). scale defaults to 1/sqrt(D).
//   sdpa_with_kv_cache(q, k, v, k_cache, v_cache, start_pos, seq_len, ...):
//     update_cache for k and v, then attention as above over start_pos+seq_len
//     keys (all Smax with a mask).
//   custom_quantized_sdpa(q, k_cache, v_cache, start_pos, mask, dropout,
//                         is_causal, scale, q_zp, q_scale, k_zp, k_scale,
//                         v_zp, v_scale, is_seq_at_dim_2):
//     custom_sdpa over int8 operands, each dequantized per (batch, position,
//     head) as (x - zp) * scale ([B, S, H, 1] float scales, int8 zero points):
//     the attention of ExecuTorch's quantize_kv_cache export, whose
//     update_cache calls write the int8 caches and their parameters. Only
//     is_seq_at_dim_2 = False ([B, S, H, D], as the exporter emits it).
//
// The cache-writing kernels also report the cache tensors they are handed to
// the running forward call's KV recorder (kv_cache.h): that is how the runtime
// finds a model's caches for session snapshots without names in the .pte.
#pragma once

#include <executorch/runtime/kernel/kernel_includes.h>

#include <cstdint>
#include <optional>

namespace etserve {

using executorch::aten::Tensor;
using executorch::runtime::KernelRuntimeContext;

Tensor& update_cache_out(KernelRuntimeContext& ctx, const Tensor& value,
                         const Tensor& cache, int64_t start_pos, Tensor& out);

Tensor& update_cache_with_indices_out(KernelRuntimeContext& ctx, const Tensor& value,
                                      const Tensor& cache, int64_t start_pos,
                                      const Tensor& indices, Tensor& out);

Tensor& custom_sdpa_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k,
                        const Tensor& v, int64_t start_pos,
                        const std::optional<Tensor>& mask, double dropout_p,
                        bool is_causal, const std::optional<double>& scale, Tensor& out);

Tensor& sdpa_with_kv_cache_out(KernelRuntimeContext& ctx, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& k_cache,
                               const Tensor& v_cache, int64_t start_pos, int64_t seq_len,
                               const std::optional<Tensor>& mask, double dropout_p,
                               bool is_causal, const std::optional<double>& scale,
                               Tensor& out);

Tensor& custom_quantized_sdpa_out(
    KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
    int64_t start_pos, const std::optional<Tensor>& mask, double dropout_p, bool is_causal,
    const std::optional<double>& scale, const std::optional<Tensor>& q_zero_points,
    const std::optional<Tensor>& q_scales, const std::optional<Tensor>& k_zero_points,
    const std::optional<Tensor>& k_scales, const std::optional<Tensor>& v_zero_points,
    const std::optional<Tensor>& v_scales, bool is_seq_at_dim_2, Tensor& out);

}  // namespace etserve
