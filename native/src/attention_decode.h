// The one-query-row attention kernel over int8 KV caches (decode): every
// query head that shares a kv head walks the keys together, each key and
// value row read once from memory and converted in registers (never written
// back), its zero point folded into one correction per row and head. With
// AVX-512 VNNI the scores are exact int32 dot products (16 keys transposed in
// registers) and the weighted sums take the weights as 8-bit fixed point per
// head and 64-key block (vpdpbusd over quads of keys); with AVX2 the scores
// are exact int32 dot products too (int16 keys two rows a vector, queries
// less their zero point, vpmaddwd; eight keys' lanes reduced at a time, and
// the softmax's maxima taken as they are made) and the weighted sums
// take 7-bit weights (vpmaddubsw and vpmaddwd over quads of keys: the widest
// that vpmaddubsw's saturating words hold exactly). Over caches in
// kv_layout.h's tiles (head dim 64), which llm_kernels.cpp chooses on the AVX2
// tier, the same integer products come straight out of the layout: four dims
// of eight keys per key-tile vector (scores with no horizontal sums), the
// value quads as the weighted sums take them; the output is bit for bit the
// rows' (kernel_check). Rows a few blocks ahead are prefetched while a block
// is worked, so a long cache streams from memory.
//
// For the rows that attention.cpp's generic tile handles slowest at long
// context: one query row (a decode step), int8 keys and values in
// position-major rows (or those tiles), head dim 64 or 128, at most 8 query
// heads per kv head and 64 in all.
#pragma once

#include "attention.h"

#include <cstdint>

namespace etserve {

// Whether attend_decode can run query rows of `a` (any row count: it runs one
// row at a time). Needs AVX2 and FMA at compile time, or NEON (attention_decode_neon.cpp).
// Caches in rows, or, built for AVX2 without AVX-512, tiled ones (kv_layout.h) with int8
// queries.
bool decode_attention_applies(const AttnArgs& a);

// Whether this build's decode kernel would rather read int8 caches of head dim 64 in
// kv_layout.h's tiled layouts (AVX2 without AVX-512: eight keys' scores a vector with no
// horizontal sums, the value quads as stored); the generic tile reads either layout.
// $ETSERVE_ATTENTION=generic keeps them in rows.
bool decode_reads_tiles();

// Query row i of batch b, every head, over keys [j0, j1) (cut further by the
// causal limit): block by block, each block's rows of every kv head in turn,
// so that a thread given a key range reads it in order. Normalized into a.o;
// or, when m is not null, per query head t < H the running max m[t], the sum
// of exponentials l[t] and the unnormalized weighted sum acc[t * D ..] (a key
// range's partial softmax, merged by the caller).
void attend_decode(const AttnArgs& a, int64_t b, int64_t i, int64_t j0, int64_t j1, float* m, float* l,
                   float* acc);

// Query head t of row i of batch b of int8 queries as the exact-score kernels take it: its raw
// values copied into dst (int8, or widened to int16), their sum returned, its zero point into
// zp and its scale times the softmax scale into sc.
template <typename T>
inline int32_t raw_query(const AttnArgs& a, int64_t b, int64_t i, int64_t t, int64_t D, T* dst, int32_t& zp,
                         float& sc) {
  const AttnOperand& q = a.q;
  const int8_t* src = q.i8 + b * q.sb + i * q.ss + t * q.sh;
  int32_t sum = 0;
  for (int64_t d = 0; d < D; ++d) {
    dst[d] = src[d];
    sum += src[d];
  }
  zp = q.zero_point[b * q.zp_sb + i * q.zp_ss + t * q.zp_sh];
  sc = q.scale[b * q.sc_sb + i * q.sc_ss + t * q.sc_sh] * a.scale;
  return sum;
}

}  // namespace etserve
