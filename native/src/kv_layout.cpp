// Tiled int8 KV cache layouts: see kv_layout.h.
#include "kv_layout.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>

namespace etserve {

thread_local KvLayouts* t_layouts = nullptr;

namespace {

// One block of 64 positions, all heads: rows (row-major [64][hkv][64]) <->
// tiled, between two buffers of 64 * hkv * 64 bytes.
void block_to_tiled(KvLayout l, const int8_t* rows, int8_t* tiled, int64_t hkv) {
  for (int64_t p = 0; p < kLayoutBlock; ++p) {
    for (int64_t h = 0; h < hkv; ++h) {
      const int8_t* src = rows + (p * hkv + h) * 64;
      if (l == KvLayout::kKeyTiles) {
        int8_t* dst = tiled + h * 4096 + (p >> 4) * 1024 + (p & 15) * 4;
        for (int64_t q = 0; q < 16; ++q) std::memcpy(dst + q * 64, src + q * 4, 4);
      } else {
        int8_t* dst = tiled + h * 4096 + (p >> 2) * 256 + (p & 3);
        for (int64_t d = 0; d < 64; ++d) dst[d * 4] = src[d];
      }
    }
  }
}

void block_to_rows(KvLayout l, const int8_t* tiled, int8_t* rows, int64_t hkv) {
  for (int64_t p = 0; p < kLayoutBlock; ++p) {
    for (int64_t h = 0; h < hkv; ++h) {
      int8_t* dst = rows + (p * hkv + h) * 64;
      if (l == KvLayout::kKeyTiles) {
        const int8_t* src = tiled + h * 4096 + (p >> 4) * 1024 + (p & 15) * 4;
        for (int64_t q = 0; q < 16; ++q) std::memcpy(dst + q * 4, src + q * 64, 4);
      } else {
        const int8_t* src = tiled + h * 4096 + (p >> 2) * 256 + (p & 3);
        for (int64_t d = 0; d < 64; ++d) dst[d] = src[d * 4];
      }
    }
  }
}

}  // namespace

void tiled_read(KvLayout l, const int8_t* cache, int64_t hkv, int64_t p, int64_t h, int8_t* dst) {
  const int8_t* base = cache + tiled_offset(l, hkv, p, h, 0);
  if (l == KvLayout::kKeyTiles) {
    for (int64_t q = 0; q < 16; ++q) std::memcpy(dst + q * 4, base + q * 64, 4);
  } else {
    for (int64_t d = 0; d < 64; ++d) dst[d] = base[d * 4];
  }
}

void tiled_write(KvLayout l, int8_t* cache, int64_t hkv, int64_t p, int64_t h, const int8_t* src) {
  int8_t* base = cache + tiled_offset(l, hkv, p, h, 0);
  if (l == KvLayout::kKeyTiles) {
    for (int64_t q = 0; q < 16; ++q) std::memcpy(base + q * 64, src + q * 4, 4);
  } else {
    for (int64_t d = 0; d < 64; ++d) base[d * 4] = src[d];
  }
}

namespace {

// A block of positions occupies the same bytes in both layouts:
// [block * 64 * hkv * 64, (block + 1) * 64 * hkv * 64).
void convert_blocks(KvLayout l, int8_t* cache, int64_t rows, int64_t hkv, bool tiled) {
  const size_t bytes = static_cast<size_t>(kLayoutBlock * hkv * 64);
  std::vector<int8_t> tmp(bytes);
  for (int64_t b = 0; b < rows / kLayoutBlock; ++b) {
    int8_t* blk = cache + b * static_cast<int64_t>(bytes);
    std::memcpy(tmp.data(), blk, bytes);
    if (tiled) {
      block_to_tiled(l, tmp.data(), blk, hkv);
    } else {
      block_to_rows(l, tmp.data(), blk, hkv);
    }
  }
}

}  // namespace

void to_tiled(KvLayout l, int8_t* cache, int64_t rows, int64_t hkv) { convert_blocks(l, cache, rows, hkv, true); }
void to_rows(KvLayout l, int8_t* cache, int64_t rows, int64_t hkv) { convert_blocks(l, cache, rows, hkv, false); }

KvLayout KvLayouts::of(const void* data) const {
  for (const Entry& e : tiled) {
    if (e.data == data) return e.layout;
  }
  return KvLayout::kRows;
}

void KvLayouts::set(const void* data, KvLayout l, int64_t rows, int64_t hkv) {
  for (size_t i = 0; i < tiled.size(); ++i) {
    if (tiled[i].data == data) {
      if (l == KvLayout::kRows) {
        tiled.erase(tiled.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        tiled[i] = Entry{data, l, rows, hkv};
      }
      return;
    }
  }
  if (l != KvLayout::kRows) tiled.push_back(Entry{data, l, rows, hkv});
}

namespace {

// Kernels called on their own, outside any forward call, are called by the native tests only:
// through libetserve_test.so (native/test/), whose etserve_test_kv_layouts gives the calling
// thread a set of layouts as a forward call does. This library exports nothing but etserve.h's
// functions, so it looks that library up (by its soname, only if already loaded) instead.
KvLayouts* test_library_layouts() {
  using Fn = KvLayouts* (*)();
  static std::atomic<Fn> cached{nullptr};
  Fn fn = cached.load(std::memory_order_acquire);
  if (fn == nullptr) {
    void* lib = dlopen("libetserve_test.so", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) return nullptr;
    fn = reinterpret_cast<Fn>(dlsym(lib, "etserve_test_current_kv_layouts"));
    dlclose(lib);  // RTLD_NOLOAD took a reference; the library stays loaded by its opener
    if (fn == nullptr) return nullptr;
    cached.store(fn, std::memory_order_release);
  }
  return fn();
}

}  // namespace

KvLayouts* current_kv_layouts() { return t_layouts != nullptr ? t_layouts : test_library_layouts(); }

KvLayoutScope::KvLayoutScope(KvLayouts* l) : prev_(t_layouts) { t_layouts = l; }
KvLayoutScope::~KvLayoutScope() { t_layouts = prev_; }

}  // namespace etserve
