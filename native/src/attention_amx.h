// Attention over an int8 KV cache on Intel AMX tiles (attention_amx.cpp), used
// by run_attention (attention.cpp) when the CPU and the kernel allow it.
//
// Same contract as the generic tile of attention.cpp: a tile of query rows
// times the G query heads sharing one kv head, over keys [j0, j1), with an
// online softmax; results normalized into the output or, for a key split,
// left as partial (max, sum, weighted sum) triples. Exact to ~1e-6 relative,
// like the generic kernel:
// - scores: the raw int8 keys against the query in 22-bit fixed point, as
//   three int8 digits (AMX-INT8, int32 sums), the zero points and scales
//   applied after;
// - weighted sums: the raw int8 values, exact in bf16, against the
//   probabilities times the value scales split into two bf16 terms (hi + lo),
//   fp32 sums (AMX-BF16); the zero points subtracted after.
#pragma once

#include <cstdint>

namespace etserve {

struct AttnArgs;

// True when this process may use the AMX path: the CPU has AMX-INT8, AMX-BF16
// and AVX512-BF16, the OS saves their state and granted this process the tile
// data permission. Checked once.
bool amx_attention_supported();

// D == 64 and int8 key and value caches: the shapes the AMX path handles.
bool amx_attention_applies(const AttnArgs& a);

struct AmxScratch;
AmxScratch* amx_scratch_new(int64_t rows, int64_t G);
void amx_scratch_free(AmxScratch* s);

// The AMX tile: query rows [i0, i0 + R) of batch b, kv head g, keys [j0, j1).
// part_m/part_l/part_acc: null to write the normalized output; else the
// partial results of the R * G query vectors (max, sum, D weighted sums each).
void attend_tile_amx(const AttnArgs& a, int64_t b, int64_t i0, int64_t R, int64_t g, int64_t j0,
                     int64_t j1, AmxScratch* sc, float* part_m, float* part_l, float* part_acc);

// Query row (b, s, h) as floats times `mul` (attention.cpp).
const float* attn_query_row(const AttnArgs& a, int64_t b, int64_t s, int64_t h, float* buf,
                            float mul);

}  // namespace etserve
