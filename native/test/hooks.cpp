// Test hooks kept out of libetserve.so, which exports only etserve.h's
// functions (tests/native/test_abi.py checks it): the registered operators'
// names, and layouts for kernels called on their own.
#include <executorch/runtime/kernel/operator_registry.h>

#include <cstring>
#include <vector>

#include "../src/kv_layout.h"

#define ETS_TEST_API __attribute__((visibility("default")))

namespace {

// What libetserve.so's llm_ops.cpp registers when it loads.
const char* const kOurOps[] = {
    "llama::update_cache.out",      "llama::update_cache_with_indices.out",
    "llama::custom_sdpa.out",       "llama::sdpa_with_kv_cache.out",
    "llama::custom_quantized_sdpa.out", "etserve::linear_q4.out",
};

// The registry's operators in our namespaces (llama::, etserve::), in registration order.
std::vector<const char*> our_registered_ops() {
  std::vector<const char*> out;
  for (const auto& k : executorch::runtime::get_registered_kernels()) {
    if (std::strncmp(k.name_, "llama::", 7) == 0 || std::strncmp(k.name_, "etserve::", 9) == 0) {
      out.push_back(k.name_);
    }
  }
  return out;
}

thread_local etserve::KvLayouts* t_layouts = nullptr;

}  // namespace

extern "C" {

// Registered operators of ours: count, and name i ("llama::custom_sdpa.out"), NULL out of range.
ETS_TEST_API int etserve_llm_op_count(void) { return static_cast<int>(our_registered_ops().size()); }

ETS_TEST_API const char* etserve_llm_op_name(int i) {
  const auto ops = our_registered_ops();
  return (i >= 0 && i < static_cast<int>(ops.size())) ? ops[static_cast<size_t>(i)] : nullptr;
}

// 1 if every operator libetserve.so registers is in the registry.
ETS_TEST_API int etserve_llm_ops_registered(void) {
  for (const char* name : kOurOps) {
    if (!executorch::runtime::registry_has_op_function(name)) return 0;
  }
  return 1;
}

// For the kernels' tests and benchmarks, which call the operators on their
// own (no model, no forward call): on != 0 gives the calling thread a set of
// layouts, as a forward call does, so the int8 caches it passes are kept in
// tile layout from the first AMX attention over them on; 0 forgets them
// (their buffers are the caller's, and may be freed and reused) and ends it.
ETS_TEST_API void etserve_test_kv_layouts(int on) {
  thread_local etserve::KvLayouts layouts;
  layouts.tiled.clear();
  t_layouts = on != 0 ? &layouts : nullptr;
}

// What libetserve.so's kernels use outside a forward call (kv_layout.cpp
// looks it up in this library, by its soname, when it is loaded).
ETS_TEST_API etserve::KvLayouts* etserve_test_current_kv_layouts(void) { return t_layouts; }

}  // extern "C"
