// The KV caches of a loaded model, found at run time: every write into them
// goes through our llama::update_cache / sdpa_with_kv_cache kernels
// (llm_ops.cpp), which report the cache tensor they were handed to the
// recorder of the model whose forward call is running on this thread. The
// first successful forward call fixes the list; after that ets_kv_snapshot /
// ets_kv_restore (kv_cache.cpp) copy rows [0, n) of every cache.
#pragma once

#include <executorch/runtime/core/exec_aten/exec_aten.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace etserve {

// One cache tensor [1, rows, heads, dim], in elements of `elem` bytes.
struct KvCacheView {
  char* data = nullptr;
  int64_t rows = 0, heads = 0, dim = 0;
  int64_t row_stride = 0, head_stride = 0;  // in elements; innermost stride is 1
  size_t elem = 0;
  size_t row_bytes() const { return static_cast<size_t>(heads * dim) * elem; }
  bool dense() const { return row_stride == heads * dim && (heads <= 1 || head_stride == dim); }
};

struct KvRecorder {
  std::vector<KvCacheView> caches;  // in the order the forward call first wrote them
  bool discovered = false;          // a forward call succeeded while recording
  std::string unsupported;          // why snapshots cannot work for this model ("" if they can)

  // Called by the kernels (through kv_observe*) while a forward call runs.
  void observe(const executorch::aten::Tensor& cache, const char* op);
  size_t bytes_per_position() const;
};

// Makes `rec` (may be null) the recorder of the forward call on this thread
// for the scope's lifetime, unless it has already discovered its caches.
// On destruction with success == false the partial record is dropped.
class KvRecordScope {
 public:
  explicit KvRecordScope(KvRecorder* rec);
  ~KvRecordScope();
  void succeeded() { ok_ = true; }

 private:
  KvRecorder* rec_;
  KvRecorder* prev_;
  bool ok_ = false;
};

// Kernel hooks: no-ops unless a recording forward call runs on this thread.
void kv_observe(const executorch::aten::Tensor& cache, const char* op);
// Writes at arbitrary rows (ring buffers): positions are not rows, so the
// model's caches cannot be snapshotted by position.
void kv_observe_indexed(const char* op);

}  // namespace etserve
