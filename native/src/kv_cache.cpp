// KV cache discovery and snapshots: see kv_cache.h and the ets_kv_* calls in
// include/etserve.h.
#include "kv_cache.h"
#include "kv_layout.h"

#include "etserve.h"
#include "model.h"

#include <cstring>
#include <string>

namespace etserve {

namespace {
thread_local KvRecorder* t_recorder = nullptr;
}  // namespace

KvRecordScope::KvRecordScope(KvRecorder* rec)
    : rec_(rec != nullptr && !rec->discovered ? rec : nullptr), prev_(t_recorder) {
  if (rec_ != nullptr) {
    rec_->caches.clear();
    rec_->unsupported.clear();
  }
  t_recorder = rec_;
}

KvRecordScope::~KvRecordScope() {
  t_recorder = prev_;
  if (rec_ == nullptr) return;
  if (ok_) {
    rec_->discovered = true;
  } else {
    rec_->caches.clear();
    rec_->unsupported.clear();
  }
}

void KvRecorder::observe(const executorch::aten::Tensor& cache, const char* op) {
  char* data = static_cast<char*>(cache.mutable_data_ptr());
  for (const KvCacheView& c : caches) {
    if (c.data == data) return;  // every layer writes its caches once per call, or more
  }
  if (!unsupported.empty()) return;
  if (cache.dim() != 4 || cache.size(0) != 1) {
    unsupported = std::string(op) + " wrote a cache that is not [1, positions, heads, dim]";
    return;
  }
  const auto st = cache.strides();
  if (cache.size(3) > 1 && st[3] != 1) {
    unsupported = std::string(op) + " wrote a cache whose innermost dimension is strided";
    return;
  }
  KvCacheView v;
  v.data = data;
  v.rows = cache.size(1);
  v.heads = cache.size(2);
  v.dim = cache.size(3);
  v.row_stride = st[1];
  v.head_stride = st[2];
  v.elem = static_cast<size_t>(cache.element_size());
  caches.push_back(v);
}

size_t KvRecorder::bytes_per_position() const {
  size_t n = 0;
  for (const KvCacheView& c : caches) n += c.row_bytes();
  return n;
}

void kv_observe(const executorch::aten::Tensor& cache, const char* op) {
  if (t_recorder != nullptr) t_recorder->observe(cache, op);
}

void kv_observe_indexed(const char* op) {
  if (t_recorder != nullptr && t_recorder->unsupported.empty()) {
    t_recorder->unsupported = std::string(op) +
                              " writes cache rows by index (a ring buffer): rows are not positions";
  }
}

}  // namespace etserve

namespace {

using etserve::KvCacheView;

using etserve::KvLayout;

// Rows [0, n) of a cache in a tiled layout (kv_layout.h) into `dst`, position-major:
// whole blocks of 64 positions take the same bytes in both layouts.
void tiled_rows_out(const KvCacheView& c, KvLayout l, int64_t n, char* dst) {
  const int64_t full = n / etserve::kLayoutBlock * etserve::kLayoutBlock;
  const size_t row = c.row_bytes();
  std::memcpy(dst, c.data, static_cast<size_t>(full) * row);
  etserve::to_rows(l, reinterpret_cast<int8_t*>(dst), full, c.heads);
  for (int64_t p = full; p < n; ++p) {
    for (int64_t h = 0; h < c.heads; ++h)
      etserve::tiled_read(l, reinterpret_cast<const int8_t*>(c.data), c.heads, p, h,
                          reinterpret_cast<int8_t*>(dst + p * row + h * c.dim));
  }
}

void tiled_rows_in(const KvCacheView& c, KvLayout l, int64_t n, const char* src) {
  const int64_t full = n / etserve::kLayoutBlock * etserve::kLayoutBlock;
  const size_t row = c.row_bytes();
  std::memcpy(c.data, src, static_cast<size_t>(full) * row);
  etserve::to_tiled(l, reinterpret_cast<int8_t*>(c.data), full, c.heads);
  for (int64_t p = full; p < n; ++p) {
    for (int64_t h = 0; h < c.heads; ++h)
      etserve::tiled_write(l, reinterpret_cast<int8_t*>(c.data), c.heads, p, h,
                           reinterpret_cast<const int8_t*>(src + p * row + h * c.dim));
  }
}

// Row s of cache c as one contiguous block, or head by head.
void copy_rows_out(const KvCacheView& c, int64_t n, char* dst) {
  if (c.dense()) {
    std::memcpy(dst, c.data, static_cast<size_t>(n) * c.row_bytes());
    return;
  }
  const size_t head_bytes = static_cast<size_t>(c.dim) * c.elem;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t h = 0; h < c.heads; ++h) {
      std::memcpy(dst, c.data + (s * c.row_stride + h * c.head_stride) * c.elem, head_bytes);
      dst += head_bytes;
    }
  }
}

void copy_rows_in(const KvCacheView& c, int64_t n, const char* src) {
  if (c.dense()) {
    std::memcpy(c.data, src, static_cast<size_t>(n) * c.row_bytes());
    return;
  }
  const size_t head_bytes = static_cast<size_t>(c.dim) * c.elem;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t h = 0; h < c.heads; ++h) {
      std::memcpy(c.data + (s * c.row_stride + h * c.head_stride) * c.elem, src, head_bytes);
      src += head_bytes;
    }
  }
}

// A cache as the selected slot holds it (kv_slots.h).
KvCacheView in_active_slot(const ets_model* m, const KvCacheView& c) {
  KvCacheView v = c;
  v.data = m->slots.data_of(c.data, m->slots.active());
  return v;
}

// ETS_OK if the model's caches are known and usable, else the error code with
// the reason in m->error.
int kv_ready(ets_model* m) {
  const etserve::KvRecorder& kv = m->kv;
  if (!kv.discovered) {
    return m->fail(ETS_ERR_STATE,
                   "the KV caches are found during the first forward call, and none has "
                   "succeeded yet");
  }
  if (!kv.unsupported.empty()) {
    return m->fail(ETS_ERR_UNSUPPORTED, "KV snapshots are not possible for this model: " +
                                      kv.unsupported);
  }
  if (kv.caches.empty()) {
    return m->fail(ETS_ERR_UNSUPPORTED,
                   "this model's KV caches are not written through etserve's "
                   "llama::update_cache or llama::sdpa_with_kv_cache kernels (exported "
                   "without the LLM custom ops?), so they cannot be snapshotted");
  }
  return ETS_OK;
}

int check_positions(ets_model* m, int64_t n) {
  if (n < 0) return m->fail(ETS_ERR_INVALID_ARGUMENT, "a negative number of positions");
  for (const KvCacheView& c : m->kv.caches) {
    if (n > c.rows) {
      return m->fail(ETS_ERR_OUT_OF_RANGE, std::to_string(n) +
                                               " positions are more than the KV cache holds (" +
                                               std::to_string(c.rows) + ")");
    }
  }
  return ETS_OK;
}

}  // namespace

extern "C" {

int ets_kv_info(ets_model* m, int64_t* n_caches, int64_t* bytes_per_position) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  int rc = kv_ready(m);
  if (rc != ETS_OK) return rc;
  if (n_caches != nullptr) *n_caches = static_cast<int64_t>(m->kv.caches.size());
  if (bytes_per_position != nullptr) {
    *bytes_per_position = static_cast<int64_t>(m->kv.bytes_per_position());
  }
  return ETS_OK;
}

int ets_kv_snapshot(ets_model* m, int64_t n_positions, void* out, size_t out_len) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  int rc = kv_ready(m);
  if (rc == ETS_OK) rc = check_positions(m, n_positions);
  if (rc != ETS_OK) return rc;
  const size_t need = static_cast<size_t>(n_positions) * m->kv.bytes_per_position();
  if (out_len < need || (need > 0 && out == nullptr)) {
    return m->fail(ETS_ERR_INVALID_ARGUMENT, "the snapshot buffer holds " +
                                                 std::to_string(out_len) + " bytes; " +
                                                 std::to_string(need) + " are needed");
  }
  char* dst = static_cast<char*>(out);
  for (const KvCacheView& base : m->kv.caches) {
    const KvCacheView c = in_active_slot(m, base);
    const KvLayout l = m->kv_layouts.of(c.data);
    if (l != KvLayout::kRows) {
      tiled_rows_out(c, l, n_positions, dst);
    } else {
      copy_rows_out(c, n_positions, dst);
    }
    dst += static_cast<size_t>(n_positions) * c.row_bytes();
  }
  return ETS_OK;
}

int ets_kv_restore(ets_model* m, int64_t n_positions, const void* in, size_t in_len) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  int rc = kv_ready(m);
  if (rc == ETS_OK) rc = check_positions(m, n_positions);
  if (rc != ETS_OK) return rc;
  const size_t bpp = m->kv.bytes_per_position();
  if (in_len % bpp != 0 || (in_len > 0 && in == nullptr)) {
    return m->fail(ETS_ERR_INVALID_ARGUMENT,
                   "a snapshot of this model is a multiple of " + std::to_string(bpp) +
                       " bytes; got " + std::to_string(in_len));
  }
  const int64_t stored = static_cast<int64_t>(in_len / bpp);
  if (n_positions > stored) {
    return m->fail(ETS_ERR_OUT_OF_RANGE, "the snapshot holds " + std::to_string(stored) +
                                             " positions; " + std::to_string(n_positions) +
                                             " were asked for");
  }
  const char* src = static_cast<const char*>(in);
  for (const KvCacheView& base : m->kv.caches) {
    const KvCacheView c = in_active_slot(m, base);
    const KvLayout l = m->kv_layouts.of(c.data);
    if (l != KvLayout::kRows) {
      tiled_rows_in(c, l, n_positions, src);
    } else {
      copy_rows_in(c, n_positions, src);
    }
    src += static_cast<size_t>(stored) * c.row_bytes();
  }
  m->has_logits = false;  // they belonged to whatever ran before
  return ETS_OK;
}

}  // extern "C"
