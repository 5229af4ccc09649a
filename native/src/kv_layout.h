// The layout of a model's int8 KV caches in memory.
//
// ExecuTorch's quantized KV cache is an int8 tensor [1, max_seq_len, Hkv, 64]
// per layer for the keys and one for the values, position-major. The AMX
// attention tile (attention_amx.cpp) wants them as its tile operands, so that
// a decode step reads them straight into tiles instead of transposing (keys)
// and interleaving (values) every cached position again at every step; the
// AVX2 decode kernel (attention_decode.cpp) reads the same layout, four dims
// of eight keys a vector and the value quads as stored:
//
//   keys:   per 64 positions and kv head, 4 tiles of 16 positions, each
//           [16 dim quads][16 positions][4 dims]   (TDPBSSD's B operand of Q K^T)
//   values: per 64 positions and kv head,
//           [16 position quads][64 dims][4 positions]  (its B operand of P V)
//
// i.e. byte (p, h, d) of a [1, S, Hkv, 64] cache lives at
//   keys:   ((p / 64) * Hkv + h) * 4096 + (p / 16 % 4) * 1024 + (d / 4) * 64 + (p % 16) * 4 + d % 4
//   values: ((p / 64) * Hkv + h) * 4096 + (p / 4 % 16) * 256 + d * 4 + p % 4
// The tensor keeps its shape and bytes count; only the kernels that read and
// write it (llama::update_cache, llama::custom_quantized_sdpa, the snapshots
// of kv_cache.cpp) know. A cache is converted in place the first time the AMX
// kernel or the AVX2 tier's attends over it (llm_kernels.cpp), and back to
// rows if the generic kernel is chosen later on an AMX host; attention.cpp's
// generic tile copies a block's rows out of the tiles where it meets them
// (prefill and verify rows on the AVX2 tier). Each model keeps the list of its
// converted caches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace etserve {

enum class KvLayout : int { kRows = 0, kKeyTiles = 1, kValueTiles = 2 };

constexpr int64_t kLayoutBlock = 64;  // positions per block of the tiled layouts

// Where byte (p, h, d) of a tiled cache with `hkv` heads lives (D == 64).
inline int64_t tiled_offset(KvLayout l, int64_t hkv, int64_t p, int64_t h, int64_t d) {
  const int64_t base = ((p >> 6) * hkv + h) * 4096;
  if (l == KvLayout::kKeyTiles) return base + ((p >> 4) & 3) * 1024 + (d >> 2) * 64 + (p & 15) * 4 + (d & 3);
  return base + ((p >> 2) & 15) * 256 + d * 4 + (p & 3);
}

// Row (p, h) of a tiled cache: 64 bytes out of or into the layout.
void tiled_read(KvLayout l, const int8_t* cache, int64_t hkv, int64_t p, int64_t h, int8_t* dst);
void tiled_write(KvLayout l, int8_t* cache, int64_t hkv, int64_t p, int64_t h, const int8_t* src);

// Converts a whole cache of `rows` positions (a multiple of 64) in place.
void to_tiled(KvLayout l, int8_t* cache, int64_t rows, int64_t hkv);
void to_rows(KvLayout l, int8_t* cache, int64_t rows, int64_t hkv);

// The caches of one model that are not in rows.
struct KvLayouts {
  struct Entry {
    const void* data;
    KvLayout layout;
    int64_t rows, hkv;
  };
  std::vector<Entry> tiled;

  KvLayout of(const void* data) const;
  void set(const void* data, KvLayout l, int64_t rows, int64_t hkv);  // kRows: forget it
};

// The layouts of the model whose forward call runs on this thread; outside one
// (kernels called on their own, as only the native tests do) those
// libetserve_test.so's etserve_test_kv_layouts set, else null: rows only.
KvLayouts* current_kv_layouts();

class KvLayoutScope {
 public:
  explicit KvLayoutScope(KvLayouts* l);
  ~KvLayoutScope();

 private:
  KvLayouts* prev_;
};

}  // namespace etserve
