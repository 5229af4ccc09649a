// The attention core of etserve's SDPA kernels: softmax(q k^T * scale + mask) v
// over strided views of the query and the KV caches, each either fp32 or int8
// with a float scale and an int8 zero point per (batch, position, head)
// (ExecuTorch's per-token affine quantization: x = (q - zero_point) * scale).
//
// Flash-style: a tile of query rows times the query heads that share one kv
// head walks the keys block by block with an online softmax, so each key and
// value row is read (and dequantized) once per tile, not once per query row.
// Threaded over (batch, row tile, kv head) units and, when there are few of
// them (decode), over key ranges whose partial softmaxes are merged.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace etserve {

// One operand [B, S, H, D], innermost dimension contiguous; strides in elements.
struct AttnOperand {
  const float* f32 = nullptr;  // fp32 data, or
  const int8_t* i8 = nullptr;  // int8 data with per-(b, s, h) parameters:
  const float* scale = nullptr;
  const int8_t* zero_point = nullptr;
  int64_t sb = 0, ss = 0, sh = 0;            // data strides
  int64_t sc_sb = 0, sc_ss = 0, sc_sh = 0;   // scale strides
  int64_t zp_sb = 0, zp_ss = 0, zp_sh = 0;   // zero-point strides
  // int8 caches only: 0 position-major rows (the strides above); else one of
  // kv_layout.h's tiled layouts (1 keys, 2 values) of a [1, S, hkv, 64] cache
  // (llm_kernels.cpp's choice: the AMX kernel's, and the AVX2 decode kernel's;
  // the generic tile copies a block's rows out of the tiles).
  int tiled = 0;
  int64_t hkv = 0;
};

struct AttnArgs {
  AttnOperand q, k, v;  // q [B,S,H,D]; k, v [B,Smax,Hkv,D]
  float* o;             // fp32 [B,S,H,D]
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

// The kernel for int8 KV caches: want 0 generic, 1 AMX (if supported), -1
// leave as is. Returns the kernel in use (1 AMX, 0 generic), or -1 when AMX
// was asked for and this CPU or OS lacks it. Chosen at first use: AMX where
// supported unless $ETSERVE_ATTENTION=generic.
int attention_kernel(int want);

// $ETSERVE_ATTENTION=generic: the generic kernels only (no AMX tiles), the int8 caches in rows.
inline bool attention_forced_generic() {
  static const bool forced = [] {
    const char* env = std::getenv("ETSERVE_ATTENTION");
    return env != nullptr && std::strcmp(env, "generic") == 0;
  }();
  return forced;
}

}  // namespace etserve
