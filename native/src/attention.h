// The attention core of etserve's SDPA kernels: softmax(q k^T * scale + mask) v
// over strided fp32 views of the query and the KV caches, grouped-query heads
// processed together, threaded over (batch, row, kv head) units and, for few
// units (decode), over key ranges whose partial softmaxes are merged.
#pragma once

#include <cstdint>

namespace etserve {

// Strided views (innermost dimension contiguous); strides in elements.
struct AttnArgs {
  const float* q;
  int64_t q_sb, q_ss, q_sh;
  const float* k;
  int64_t k_sb, k_ss, k_sh;
  const float* v;
  int64_t v_sb, v_ss, v_sh;
  float* o;
  int64_t o_sb, o_ss, o_sh;
  int64_t B, S, H, Hkv, D;
  int64_t n_kv;       // keys visible to every row before the causal cut
  int64_t start_pos;  // absolute position of query row 0
  bool causal;
  const float* mask;  // nullable, [S, >= n_kv] with row stride mask_ss
  int64_t mask_ss;
  float scale;
};

// Writes o for every (batch, row, head) of `a`.
void run_attention(const AttnArgs& a);

}  // namespace etserve
