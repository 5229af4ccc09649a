// The one-query-row attention kernel over int8 KV caches (decode): every
// query head that shares a kv head walks the keys together, each key and
// value row read once from memory and converted in registers (never written
// back), its zero point folded into one correction per row and head. With
// AVX-512 VNNI the scores are exact int32 dot products (16 keys transposed in
// registers) and the weighted sums take the weights as 16-bit fixed point per
// head and 64-key block (vpdpwssd over pairs of keys); with AVX2 the scores
// are exact int32 dot products too (int16 keys and queries, vpmaddwd; eight
// keys' lanes reduced at a time) and the weighted sums floats, G accumulators
// per slice of the head dimension. Rows a few blocks ahead are prefetched
// while a block is worked, so a long cache streams from memory.
//
// For the rows that attention.cpp's generic tile handles slowest at long
// context: one query row (a decode step), int8 keys and values in
// position-major rows, head dim 64 or 128, at most 8 query heads per kv head
// and 64 in all.
#pragma once

#include "attention.h"

#include <cstdint>

namespace etserve {

// Whether attend_decode can run query rows of `a` (any row count: it runs one
// row at a time). Needs AVX2 and FMA at compile time, or NEON (attention_decode_neon.cpp).
bool decode_attention_applies(const AttnArgs& a);

// Query row i of batch b, every head, over keys [j0, j1) (cut further by the
// causal limit): block by block, each block's rows of every kv head in turn,
// so that a thread given a key range reads it in order. Normalized into a.o;
// or, when m is not null, per query head t < H the running max m[t], the sum
// of exponentials l[t] and the unnormalized weighted sum acc[t * D ..] (a key
// range's partial softmax, merged by the caller).
void attend_decode(const AttnArgs& a, int64_t b, int64_t i, int64_t j0, int64_t j1, float* m, float* l,
                   float* acc);

}  // namespace etserve
