// Attention over an int8 KV cache on Intel AMX tiles (attention_amx.cpp), used
// by run_attention (attention.cpp) when the CPU and the kernel allow it.
//
// Same contract as the generic tile of attention.cpp: a tile of query rows
// times the G query heads sharing one kv head, over keys [j0, j1), with an
// online softmax; results normalized into the output or, for a key split,
// left as partial (max, sum, weighted sum) triples. Scores exact in integers
// (the raw int8 queries and keys); weighted sums exact to ~1e-6 relative, like
// the generic kernel, except over tiled caches, whose probabilities are
// 16-bit fixed point per 128-key block (~2^-14 of the outputs' range; details in
// attention_amx.cpp). Over caches in rows or in
// kv_layout.h's tile layout (AttnOperand::tiled), where a decode step reads
// them straight into tiles.
#pragma once

#include <cstdint>

namespace etserve {

struct AttnArgs;

// True when this process may use the AMX path: the CPU has AMX-INT8, AMX-BF16
// and AVX512-BF16, the OS saves their state and granted this process the tile
// data permission. Checked once.
bool amx_attention_supported();

// D == 64 and an int8 query and caches: the shapes the AMX path handles.
bool amx_attention_applies(const AttnArgs& a);

struct AmxScratch;
AmxScratch* amx_scratch_new(int64_t rows, int64_t G);
void amx_scratch_free(AmxScratch* s);

// The AMX tile: query rows [i0, i0 + R) of batch b, kv head g, keys [j0, j1).
// part_m/part_l/part_acc: null to write the normalized output; else the
// partial results of the R * G query vectors (max, sum, D weighted sums each).
void attend_tile_amx(const AttnArgs& a, int64_t b, int64_t i0, int64_t R, int64_t g, int64_t j0,
                     int64_t j1, AmxScratch* sc, float* part_m, float* part_l, float* part_acc);

}  // namespace etserve
