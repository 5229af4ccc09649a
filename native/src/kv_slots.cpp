// Sequence slots: see kv_slots.h and the ets_kv_slot* calls in include/etserve.h.
#include "kv_slots.h"

#include "etserve.h"
#include "model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace etserve {

namespace {

thread_local const KvSlots* t_slots = nullptr;

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

KvSlots::~KvSlots() {
  for (const Map& m : maps_) munmap(m.base, m.length);
}

bool KvSlots::resize(int n, const KvRecorder& kv, KvLayouts* layouts, std::string* why) {
  if (n < 1) {
    *why = "a model has at least one slot";
    return false;
  }
  if (n > 1 && (!kv.discovered || kv.caches.empty() || !kv.unsupported.empty())) {
    *why = kv.unsupported.empty() ? "the KV caches are not known yet (no forward call has succeeded)"
                                  : "this model's KV caches cannot be switched: " + kv.unsupported;
    return false;
  }
  if (bases_.empty() && n > 1) {
    size_t off = 0;
    for (size_t i = 0; i < kv.caches.size(); ++i) {
      const KvCacheView& c = kv.caches[i];
      if (!c.dense()) {
        *why = "a KV cache is not dense ([1, positions, heads, dim] with rows back to back)";
        return false;
      }
      bases_.emplace_back(c.data, i);
      offsets_.push_back(off);
      off = round_up(off + static_cast<size_t>(c.rows) * c.row_bytes(), page_size());
    }
    span_ = off;
    std::sort(bases_.begin(), bases_.end());
  }
  layouts_ = layouts;
  while (count() > n) {
    forget_layouts(maps_.back());
    munmap(maps_.back().base, maps_.back().length);
    maps_.pop_back();
  }
  while (count() < n) {
    void* p = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      *why = "mapping " + std::to_string(span_) + " bytes for a slot failed: " + std::strerror(errno);
      return false;
    }
    // Small pages: a slot is paid for by the positions it holds, not by 2 MB at the start of
    // every cache (a huge page per layer would cost each slot ~100 MB before its first token).
    madvise(p, span_, MADV_NOHUGEPAGE);
    madvise(p, span_, MADV_DONTDUMP);
    maps_.push_back(Map{static_cast<char*>(p), span_});
    // Zeros read alike in every layout: the new buffers take the layout of the program's.
    const int slot = count() - 1;
    for (const KvCacheView& c : kv.caches) {
      const KvLayout l = layouts_ != nullptr ? layouts_->of(c.data) : KvLayout::kRows;
      if (l != KvLayout::kRows) layouts_->set(data_of(c.data, slot), l, c.rows, c.heads);
    }
  }
  if (active_ >= count()) active_ = 0;
  return true;
}

void KvSlots::forget_layouts(const Map& map) {
  if (layouts_ == nullptr) return;
  auto& t = layouts_->tiled;
  t.erase(std::remove_if(t.begin(), t.end(),
                         [&](const KvLayouts::Entry& e) {
                           const char* d = static_cast<const char*>(e.data);
                           return d >= map.base && d < map.base + map.length;
                         }),
          t.end());
}

bool KvSlots::select(int slot) {
  if (slot < 0 || slot >= count()) return false;
  active_ = slot;
  return true;
}

long KvSlots::index_of(const void* p) const {
  const char* c = static_cast<const char*>(p);
  auto it = std::lower_bound(bases_.begin(), bases_.end(), c,
                             [](const std::pair<const char*, size_t>& e, const char* k) { return e.first < k; });
  if (it == bases_.end() || it->first != c) return -1;
  return static_cast<long>(it->second);
}

char* KvSlots::data_of(const char* base, int slot) const {
  if (slot <= 0) return const_cast<char*>(base);
  const long i = index_of(base);
  if (i < 0 || slot >= count()) return const_cast<char*>(base);
  return maps_[static_cast<size_t>(slot - 1)].base + offsets_[static_cast<size_t>(i)];
}

namespace {
thread_local int t_override = -1;  // KvSlotOverride's slot, -1: the selected one
thread_local const KvRows* t_rows = nullptr;
}  // namespace

void* KvSlots::resolve(const void* p) const {
  const int slot = t_override >= 0 ? t_override : active_;
  if (slot == 0) return const_cast<void*>(p);
  return data_of(static_cast<const char*>(p), slot);
}

char* KvSlots::cache_data(const KvRecorder& kv, size_t i, int slot) const {
  if (slot == 0) return kv.caches[i].data;
  return maps_[static_cast<size_t>(slot - 1)].base + offsets_[i];
}

size_t KvSlots::reserved_bytes(int slot, const KvRecorder& kv) const {
  if (slot < 0 || slot >= count()) return 0;
  if (slot >= 1) return maps_[static_cast<size_t>(slot - 1)].length;
  size_t n = 0;
  for (const KvCacheView& c : kv.caches) n += static_cast<size_t>(c.rows) * c.row_bytes();
  return n;
}

namespace {

// [begin, end) shrunk to whole pages.
bool inner_pages(const char* begin, const char* end, char** b, size_t* len) {
  const uintptr_t ps = page_size();
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + ps - 1) / ps * ps;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(end) / ps * ps;
  if (hi <= lo) return false;
  *b = reinterpret_cast<char*>(lo);
  *len = hi - lo;
  return true;
}

size_t resident_in(char* b, size_t len) {
  const size_t ps = page_size();
  std::vector<unsigned char> vec((len + ps - 1) / ps);
  if (mincore(b, len, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n * ps;
}

}  // namespace

size_t KvSlots::resident_bytes(int slot, const KvRecorder& kv) const {
  if (slot < 0 || slot >= count()) return 0;
  if (slot >= 1) {
    const Map& m = maps_[static_cast<size_t>(slot - 1)];
    return resident_in(m.base, m.length);
  }
  size_t n = 0;
  for (const KvCacheView& c : kv.caches) {
    char* b;
    size_t len;
    if (inner_pages(c.data, c.data + static_cast<size_t>(c.rows) * c.row_bytes(), &b, &len)) n += resident_in(b, len);
  }
  return n;
}

bool KvSlots::trim(int slot, int64_t keep, const KvRecorder& kv) {
  if (slot < 0 || slot >= count() || keep < 0) return false;
  if (slot >= 1 && keep == 0) {  // the whole mapping
    const Map& m = maps_[static_cast<size_t>(slot - 1)];
    return madvise(m.base, m.length, MADV_DONTNEED) == 0;
  }
  if (slot >= 1 && offsets_.size() != kv.caches.size()) return false;
  const int64_t kept = (keep + kLayoutBlock - 1) / kLayoutBlock * kLayoutBlock;
  bool ok = true;
  for (size_t i = 0; i < kv.caches.size(); ++i) {
    const KvCacheView& c = kv.caches[i];
    if (kept >= c.rows) continue;
    char* data = cache_data(kv, i, slot);
    char* b;
    size_t len;
    if (inner_pages(data + static_cast<size_t>(kept) * c.row_bytes(), data + static_cast<size_t>(c.rows) * c.row_bytes(),
                    &b, &len)) {
      ok = madvise(b, len, MADV_DONTNEED) == 0 && ok;  // private anonymous: zeros from now on
    }
  }
  return ok;
}

void* kv_resolve(const void* p) { return t_slots != nullptr ? t_slots->resolve(p) : const_cast<void*>(p); }

void* kv_resolve_in(const void* p, int slot) {
  if (t_slots == nullptr || slot == 0) return const_cast<void*>(p);
  return t_slots->data_of(static_cast<const char*>(p), slot);
}

KvSlotScope::KvSlotScope(const KvSlots* s) : prev_(t_slots) { t_slots = s; }
KvSlotScope::~KvSlotScope() { t_slots = prev_; }

const KvRows* current_kv_rows() { return t_rows; }
KvRowsScope::KvRowsScope(const KvRows* rows) : prev_(t_rows) { t_rows = rows; }
KvRowsScope::~KvRowsScope() { t_rows = prev_; }

KvSlotOverride::KvSlotOverride(int slot) : prev_(t_override) { t_override = slot; }
KvSlotOverride::~KvSlotOverride() { t_override = prev_; }

}  // namespace etserve

namespace {

int slot_in_range(ets_model* m, int slot) {
  if (slot < 0 || slot >= m->slots.count()) {
    return m->fail(ETS_ERR_OUT_OF_RANGE, "slot " + std::to_string(slot) + " does not exist (the model has " +
                                             std::to_string(m->slots.count()) + ")");
  }
  return ETS_OK;
}

}  // namespace

extern "C" {

int ets_kv_slots(ets_model* m, int n) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  std::string why;
  if (!m->slots.resize(n, m->kv, &m->kv_layouts, &why)) {
    int code = ETS_ERR_RUNTIME;
    if (n < 1) {
      code = ETS_ERR_INVALID_ARGUMENT;
    } else if (!m->kv.discovered) {
      code = ETS_ERR_STATE;  // not yet: a forward call finds the caches
    } else if (!m->kv.unsupported.empty() || m->kv.caches.empty()) {
      code = ETS_ERR_UNSUPPORTED;
    }
    return m->fail(code, why);
  }
  return ETS_OK;
}

int ets_kv_slot_count(const ets_model* m) { return m == nullptr ? 0 : m->slots.count(); }

int ets_kv_select(ets_model* m, int slot) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  int rc = slot_in_range(m, slot);
  if (rc != ETS_OK) return rc;
  if (slot != m->slots.active()) m->has_logits = false;  // they belonged to the other slot
  m->slots.select(slot);
  return ETS_OK;
}

int ets_kv_copy(ets_model* m, int src, int dst, int64_t n_positions) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  int rc = slot_in_range(m, src);
  if (rc == ETS_OK) rc = slot_in_range(m, dst);
  if (rc != ETS_OK) return rc;
  if (m->kv.caches.empty() || !m->kv.discovered) {
    return m->fail(ETS_ERR_STATE, "the KV caches are not known yet (no forward call has succeeded)");
  }
  if (n_positions < 0 || n_positions > m->info.max_seq_len) {
    return m->fail(ETS_ERR_OUT_OF_RANGE, std::to_string(n_positions) + " positions are outside the KV cache");
  }
  if (src == dst || n_positions == 0) return ETS_OK;
  for (const etserve::KvCacheView& c : m->kv.caches) {
    const char* from = m->slots.data_of(c.data, src);
    char* to = m->slots.data_of(c.data, dst);
    const etserve::KvLayout lf = m->kv_layouts.of(from), lt = m->kv_layouts.of(to);
    // A slot no attention has read since it was made holds its caches in rows (llm_kernels.cpp
    // converts a slot's at its first attention): the copy defines the destination's positions
    // [0, n) and nothing after them is read again before it is written, so the destination
    // takes the source's layout as it is.
    if (lf != lt) m->kv_layouts.set(to, lf, c.rows, c.heads);
    size_t bytes;
    if (lf != etserve::KvLayout::kRows) {  // whole blocks of 64 positions are contiguous
      const int64_t blocks = (n_positions + etserve::kLayoutBlock - 1) / etserve::kLayoutBlock;
      bytes = static_cast<size_t>(blocks * etserve::kLayoutBlock) * c.row_bytes();
    } else {
      bytes = static_cast<size_t>(n_positions) * c.row_bytes();
    }
    std::memcpy(to, from, std::min(bytes, static_cast<size_t>(c.rows) * c.row_bytes()));
  }
  if (dst == m->slots.active()) m->has_logits = false;
  return ETS_OK;
}

int ets_kv_slot_memory(const ets_model* m, int slot, int64_t* reserved, int64_t* resident) {
  if (m == nullptr || slot < 0 || slot >= m->slots.count()) return ETS_ERR_INVALID_ARGUMENT;
  if (reserved != nullptr) *reserved = static_cast<int64_t>(m->slots.reserved_bytes(slot, m->kv));
  if (resident != nullptr) *resident = static_cast<int64_t>(m->slots.resident_bytes(slot, m->kv));
  return ETS_OK;
}

int ets_kv_slot_trim(ets_model* m, int slot, int64_t keep_positions) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  if (keep_positions < 0) return m->fail(ETS_ERR_INVALID_ARGUMENT, "keep_positions is negative");
  int rc = slot_in_range(m, slot);
  if (rc != ETS_OK) return rc;
  if (!m->kv.discovered) return ETS_OK;  // no forward call yet: nothing was written
  if (!m->slots.trim(slot, keep_positions, m->kv)) {
    return m->fail(ETS_ERR_RUNTIME, std::string("giving a slot's memory back failed: ") + std::strerror(errno));
  }
  if (slot == m->slots.active()) m->has_logits = false;
  return ETS_OK;
}

}  // extern "C"
