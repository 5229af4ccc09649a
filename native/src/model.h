// The state behind an ets_model handle, shared by runtime.cpp and sampler.cpp.
#pragma once

#include "etserve.h"
#include "kv_cache.h"
#include "kv_layout.h"

#include <executorch/extension/module/module.h>

#include <memory>
#include <string>
#include <vector>

struct ets_model {
  std::unique_ptr<executorch::extension::module::Module> module;
  ets_model_info info{};
  std::vector<float> logits;  // last position of the last forward call
  bool has_logits = false;
  std::vector<int64_t> token_buf;
  std::vector<int64_t> pos_buf;
  std::vector<float> scratch;     // sampler work space, vocab_size floats
  std::vector<int32_t> order;     // sampler candidate ids
  std::vector<float> weights;     // sampler weights by token id, vocab_size floats
  int64_t forward_calls = 0;
  int64_t forward_tokens = 0;
  std::string error;
  etserve::KvRecorder kv;  // its KV caches, found by the first forward call
  etserve::KvLayouts kv_layouts;  // those its AMX attention keeps in tile layout

  bool read_metadata(std::string* why);
  int forward(const int64_t* tokens, int64_t n, int64_t start_pos);
  int fail(int code, const std::string& msg);
};
