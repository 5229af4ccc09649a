// A wheel's libetserve.so as a serving box loads it, without Python: dlopen the library (its
// RPATH finds the ExecuTorch libraries the wheel ships beside it), open a .pte, run one forward
// call and write the last position's logits. Cross-built for aarch64 and run under qemu-aarch64,
// it runs the aarch64 wheel on a real model (tests/native/test_aarch64_wheel.py).
//
//   wheel_smoke LIBRARY MODEL.pte LOGITS_OUT TOKEN...
//
// Prints "isa <kernel set>" and "vocab <n>"; exits non-zero, saying why, on any failure.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "etserve.h"

namespace {

template <typename F>
F symbol(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    std::fprintf(stderr, "wheel_smoke: %s: %s\n", name, dlerror());
    std::exit(3);
  }
  return reinterpret_cast<F>(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: wheel_smoke LIBRARY MODEL.pte LOGITS_OUT TOKEN...\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "wheel_smoke: dlopen %s: %s\n", argv[1], dlerror());
    return 3;
  }
  auto vector_isa = symbol<const char* (*)()>(lib, "ets_vector_isa");
  auto set_threads = symbol<int (*)(int)>(lib, "ets_set_num_threads");
  auto open = symbol<ets_model* (*)(const char*, char*, size_t)>(lib, "ets_model_open");
  auto info = symbol<int (*)(const ets_model*, ets_model_info*)>(lib, "ets_model_get_info");
  auto forward = symbol<int (*)(ets_model*, const int64_t*, int64_t, int64_t)>(lib, "ets_forward");
  auto logits = symbol<int (*)(ets_model*, float*, int64_t)>(lib, "ets_get_logits");
  auto error = symbol<const char* (*)(const ets_model*)>(lib, "ets_model_error");
  auto close = symbol<void (*)(ets_model*)>(lib, "ets_model_close");

  std::printf("isa %s\n", vector_isa());
  set_threads(1);
  char err[1024] = {0};
  ets_model* m = open(argv[2], err, sizeof err);
  if (m == nullptr) {
    std::fprintf(stderr, "wheel_smoke: open %s: %s\n", argv[2], err);
    return 4;
  }
  ets_model_info mi{};
  std::vector<int64_t> tokens;
  for (int i = 4; i < argc; ++i) tokens.push_back(std::strtoll(argv[i], nullptr, 10));
  if (info(m, &mi) != ETS_OK || forward(m, tokens.data(), static_cast<int64_t>(tokens.size()), 0) != ETS_OK) {
    std::fprintf(stderr, "wheel_smoke: %s\n", error(m));
    close(m);
    return 5;
  }
  std::vector<float> out(static_cast<size_t>(mi.vocab_size));
  if (logits(m, out.data(), mi.vocab_size) != ETS_OK) {
    std::fprintf(stderr, "wheel_smoke: %s\n", error(m));
    close(m);
    return 5;
  }
  close(m);
  FILE* f = std::fopen(argv[3], "wb");
  if (f == nullptr || std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "wheel_smoke: cannot write %s\n", argv[3]);
    return 6;
  }
  std::printf("vocab %lld\n", static_cast<long long>(mi.vocab_size));
  return 0;
}
