#include "runtime_log.h"

#include "etserve.h"

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

std::atomic<int> g_min_level{2};  // warnings and errors by default
std::once_flag g_install_once;
thread_local bool t_capturing = false;
thread_local std::string t_captured;

int level_rank(et_pal_log_level_t level) {
  switch (level) {
    case kDebug: return 0;
    case kInfo: return 1;
    case kError: return 3;
    case kFatal: return 4;
    default: return 2;
  }
}

void emit(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*,
          size_t line, const char* message, size_t length) {
  int rank = level_rank(level);
  if (t_capturing && rank >= 3) {
    if (!t_captured.empty()) t_captured += "; ";
    t_captured.append(message, length);
  }
  if (rank < g_min_level.load(std::memory_order_relaxed)) return;
  const char* base = filename;
  for (const char* p = filename; p && *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  std::fprintf(stderr, "[executorch %c %s:%zu] %.*s\n", static_cast<char>(level),
               base ? base : "?", line, static_cast<int>(length), message);
}

}  // namespace

namespace etserve {

void log_install() {
  std::call_once(g_install_once, [] {
    if (const char* env = std::getenv("ETSERVE_NATIVE_LOG_LEVEL")) {
      g_min_level.store(std::atoi(env));
    }
    executorch::runtime::register_pal(
        executorch::runtime::PalImpl::create(emit, __FILE__));
    executorch::runtime::runtime_init();
  });
}

void log_capture_begin() {
  t_capturing = true;
  t_captured.clear();
}

std::string log_capture_end() {
  t_capturing = false;
  std::string out;
  out.swap(t_captured);
  return out;
}

}  // namespace etserve

extern "C" void ets_set_log_level(int min_level) {
  etserve::log_install();
  g_min_level.store(min_level);
}
