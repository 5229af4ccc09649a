// Sequence slots: several KV states on one weight load, switched by pointer.
//
// Slot 0 is the program's own caches (the memory-planned buffers the kernels
// are handed). Slots 1..n-1 are buffers of the same shapes in one anonymous
// mapping each, faulted in as positions are written (a slot that holds a short
// conversation costs little). While a forward call runs with slot s selected,
// every kernel that reads or writes a cache (llama::update_cache, the SDPA
// kernels, the snapshots of kv_cache.cpp) takes kv_resolve(pointer) instead of
// the tensor's own data pointer: the program never knows. A new slot's buffers
// are zeros, which read the same in every layout, so they take the layout the
// program's caches have (kv_layout.h) without a conversion.
#pragma once

#include "kv_cache.h"
#include "kv_layout.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace etserve {

class KvSlots {
 public:
  KvSlots() = default;
  KvSlots(const KvSlots&) = delete;
  KvSlots& operator=(const KvSlots&) = delete;
  ~KvSlots();

  int count() const { return 1 + static_cast<int>(maps_.size()); }
  int active() const { return active_; }

  // Makes `n` slots over the discovered caches `kv` (slot 0 their own). Fewer
  // than now frees the last ones. False with `why` filled if it cannot.
  bool resize(int n, const KvRecorder& kv, KvLayouts* layouts, std::string* why);
  bool select(int slot);  // false if out of range

  // Where cache data `base` (a discovered cache's own pointer) lives in slot `slot`.
  char* data_of(const char* base, int slot) const;
  // ... in the active slot; anything that is not a cache is returned as it is.
  void* resolve(const void* p) const;

  // A slot's caches (`kv`, the discovered ones; slot 0: the program's own, in its planned
  // memory): their bytes, and of those the bytes in memory now.
  size_t reserved_bytes(int slot, const KvRecorder& kv) const;
  size_t resident_bytes(int slot, const KvRecorder& kv) const;
  // Gives back the memory of positions >= keep (rounded up to a 64-position block, the tiled
  // layouts' unit, and inward to whole pages) of every cache of the slot; their contents
  // become zeros (private anonymous memory), which read alike in every layout.
  bool trim(int slot, int64_t keep, const KvRecorder& kv);

 private:
  struct Map {
    char* base = nullptr;
    size_t length = 0;
  };
  std::vector<std::pair<const char*, size_t>> bases_;  // cache pointer -> index, by pointer
  std::vector<size_t> offsets_;                         // by cache index, within a slot's mapping
  size_t span_ = 0;                                     // one slot's bytes
  std::vector<Map> maps_;                               // slots 1..n-1
  KvLayouts* layouts_ = nullptr;
  int active_ = 0;

  long index_of(const void* p) const;
  char* cache_data(const KvRecorder& kv, size_t i, int slot) const;  // cache i's bytes in the slot
  void forget_layouts(const Map& map);
};

// The slots of the model whose forward call runs on this thread (null outside one).
void* kv_resolve(const void* p);
// Where cache data `p` lives in slot `slot` (p itself outside a forward call or for a non-cache).
void* kv_resolve_in(const void* p, int slot);

// A rows call (ets_forward_rows): row r of the call's tokens goes to position pos[r] of slot
// slot[r]. Our cache writes and attention take each row's slot and position from here instead
// of the op's start_pos and the selected slot: every row attends over its slot up to its own
// position, so a draft's rows (one slot, consecutive positions) see the rows before them.
struct KvRows {
  int64_t n = 0;
  const int64_t* pos = nullptr;
  const int32_t* slot = nullptr;
};
const KvRows* current_kv_rows();  // null outside a rows call

class KvRowsScope {
 public:
  explicit KvRowsScope(const KvRows* rows);
  ~KvRowsScope();

 private:
  const KvRows* prev_;
};

// While alive, kv_resolve resolves into `slot` instead of the selected one (one run of a rows call).
class KvSlotOverride {
 public:
  explicit KvSlotOverride(int slot);
  ~KvSlotOverride();

 private:
  int prev_;
};

class KvSlotScope {
 public:
  explicit KvSlotScope(const KvSlots* s);
  ~KvSlotScope();

 private:
  const KvSlots* prev_;
};

}  // namespace etserve
