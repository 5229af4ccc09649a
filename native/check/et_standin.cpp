// The few ExecuTorch runtime functions etserve's kernels call, for kernel_check alone (a program
// built without the ExecuTorch libraries, e.g. cross-built for aarch64, where no libraries of that
// architecture are at hand): parallel_for on plain threads (ETS_CHECK_THREADS, default 3, so the
// kernels' key splits and partial-softmax merges run as they do in the server), logging to
// stderr, abort. The declarations are the executorch headers'; nothing else of the runtime is used.
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/abort.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace executorch::extension {

int64_t get_thread_count() {
  static const int64_t n = [] {
    const char* env = std::getenv("ETS_CHECK_THREADS");
    const int v = env ? std::atoi(env) : 3;
    return int64_t(v > 0 ? v : 1);
  }();
  return n;
}

bool parallel_for(const int64_t begin, const int64_t end, const int64_t grain_size,
                  runtime::FunctionRef<void(int64_t, int64_t)> f) {
  const int64_t n = end - begin;
  if (n <= 0) return true;
  const int64_t grain = grain_size > 0 ? grain_size : 1;
  const int64_t chunks = std::min(get_thread_count(), (n + grain - 1) / grain);
  if (chunks <= 1) {
    f(begin, end);
    return true;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  std::vector<std::thread> threads;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = begin + c * step, e = std::min(end, b + step);
    if (b < e) threads.emplace_back([&f, b, e] { f(b, e); });
  }
  f(begin, std::min(end, begin + step));
  for (std::thread& t : threads) t.join();
  return true;
}

}  // namespace executorch::extension

namespace executorch::runtime {

void runtime_abort() { std::abort(); }

namespace internal {

et_timestamp_t get_log_timestamp() { return 0; }

void vlogf(LogLevel, et_timestamp_t, const char* filename, const char*, size_t line, const char* format,
           va_list args) {
  std::fprintf(stderr, "%s:%zu: ", filename, line);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
}

Error resize_tensor_impl(etensor::TensorImpl*, ArrayRef<executorch::aten::SizesType>) {
  return Error::NotSupported;  // kernel_check calls the raw kernels, never an operator
}

}  // namespace internal

}  // namespace executorch::runtime
