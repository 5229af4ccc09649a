// The state behind an ets_model handle, shared by runtime.cpp and sampler.cpp.
#pragma once

#include "etserve.h"
#include "kv_cache.h"
#include "kv_layout.h"
#include "kv_slots.h"

#include <executorch/extension/module/module.h>

#include <executorch/runtime/core/hierarchical_allocator.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace etserve {

// A method's memory-planned buffers (activations and the KV caches: 200 MB at a
// 32k context) in anonymous mappings of our own, 2 MB aligned and advised as
// transparent huge pages before anything touches them (runtime.cpp).
class PlannedMemory {
 public:
  PlannedMemory() = default;
  PlannedMemory(const PlannedMemory&) = delete;
  PlannedMemory& operator=(const PlannedMemory&) = delete;
  ~PlannedMemory();
  // Maps buffers of these sizes; false (and nothing kept) if a mapping fails.
  bool map(const std::vector<size_t>& sizes);
  executorch::runtime::HierarchicalAllocator* allocator() const { return allocator_.get(); }
  size_t bytes() const;       // the buffers' sizes together
  size_t huge_bytes() const;  // of their mappings, resident in huge pages now (/proc/self/smaps)
  bool overlaps(uintptr_t lo, uintptr_t hi) const;  // whether [lo, hi) meets one of them

 private:
  struct Mapping {
    void* base;
    size_t length;
  };
  std::vector<Mapping> maps_;
  std::vector<executorch::runtime::Span<uint8_t>> spans_;
  std::unique_ptr<executorch::runtime::HierarchicalAllocator> allocator_;
};

}  // namespace etserve

struct ets_model {
  etserve::PlannedMemory planned;  // before `module`, which uses it: destroyed after it
  std::unique_ptr<executorch::extension::module::Module> module;
  ets_model_info info{};
  std::vector<float> logits;  // last position of the last forward call
  bool has_logits = false;
  std::vector<int64_t> token_buf;
  std::vector<int64_t> pos_buf;
  std::vector<int64_t> out_buf;
  std::vector<int32_t> slot_buf;  // a rows call's slots   // a rows build's third input: the rows whose logits come back
  std::vector<float> row_logits;  // the last rows call's logits, [rows, vocab_size]
  int64_t n_row_logits = 0;
  std::vector<float> scratch;     // sampler work space, vocab_size floats
  std::vector<int32_t> order;     // sampler candidate ids
  std::vector<float> weights;     // sampler weights by token id, vocab_size floats
  size_t loaded_huge_bytes = 0;  // of what the load allocated, moved into huge pages (runtime.cpp)
  int collapse_refused = 0;  // errno of the kernel's first refusal to collapse them, 0 if none
  int64_t forward_calls = 0;
  int64_t forward_tokens = 0;
  std::string error;
  etserve::KvRecorder kv;  // its KV caches, found by the first forward call
  etserve::KvLayouts kv_layouts;  // those its AMX attention keeps in tile layout
  etserve::KvSlots slots;  // its sequence slots (kv_slots.h): which KV state a forward call uses

  bool read_metadata(std::string* why);
  int forward(const int64_t* tokens, int64_t n, int64_t start_pos);
  int forward_rows(const int64_t* tokens, const int64_t* positions, const int32_t* slots, int64_t n);
  // Runs the program on token_buf / pos_buf / out_buf; keeps the logits of every returned row.
  int run(int64_t n, const etserve::KvRows* rows);
  int fail(int code, const std::string& msg);
};
