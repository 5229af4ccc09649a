// The model half of the C ABI: open a .pte, read its metadata methods, run
// forward in chunks, keep the last logits. See include/etserve.h.
#include "etserve.h"
#include "attention.h"
#include "kernel_isa.h"
#include "model.h"
#include "runtime_log.h"
#include "simd.h"

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <sys/mman.h>

#include <cstring>
#include <cerrno>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace executorch::extension::threadpool {
// The wheel ships libexecutorch_threadpool.so but not its header; these two
// members are all we need of the class.
class ThreadPool {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

using executorch::aten::ScalarType;
using executorch::extension::from_blob;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;
namespace threadpool = executorch::extension::threadpool;

namespace {

void copy_message(char* dst, size_t len, const std::string& msg) {
  if (dst == nullptr || len == 0) return;
  std::snprintf(dst, len, "%s", msg.c_str());
}

// Reads an int-returning metadata method such as `get_max_seq_len`.
bool read_int_method(Module& module, const std::string& name, int64_t* out) {
  auto result = module.get(name);
  if (!result.ok()) return false;
  const EValue& v = result.get();
  if (v.isInt()) {
    *out = v.toInt();
    return true;
  }
  if (v.isBool()) {
    *out = v.toBool() ? 1 : 0;
    return true;
  }
  return false;
}

// The operators a failed Method load named: ExecuTorch logs one
// "Missing operator: [N] namespace::op.overload" line per unregistered kernel.
std::string missing_operators(const std::string& log) {
  static const std::string kTag = "Missing operator: [";
  std::string names;
  for (size_t at = log.find(kTag); at != std::string::npos; at = log.find(kTag, at + 1)) {
    size_t start = log.find("] ", at + kTag.size());
    if (start == std::string::npos) break;
    start += 2;
    size_t end = log.find_first_of(" ;\n", start);
    std::string name = log.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (name.empty() || (", " + names + ", ").find(", " + name + ", ") != std::string::npos) continue;
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

std::string error_text(Error e) {
  return "ExecuTorch error 0x" + [&] {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%x", static_cast<unsigned>(e));
    return std::string(buf);
  }();
}

}  // namespace

extern "C" {

int ets_abi_sizes(int64_t* out, int n) {
  const int64_t sizes[] = {sizeof(ets_model_info), sizeof(ets_sampling)};
  const int count = static_cast<int>(sizeof(sizes) / sizeof(sizes[0]));
  for (int i = 0; i < n && i < count && out != nullptr; ++i) out[i] = sizes[i];
  return count;
}

int ets_set_num_threads(int num_threads) {
  etserve::log_install();
  unsigned n = num_threads > 0 ? static_cast<unsigned>(num_threads)
                               : std::max(1u, std::thread::hardware_concurrency());
  threadpool::ThreadPool* pool = threadpool::get_threadpool();
  if (pool == nullptr) return ETS_ERR_RUNTIME;
  return pool->_unsafe_reset_threadpool(n) ? ETS_OK : ETS_ERR_RUNTIME;
}

int ets_get_num_threads(void) {
  threadpool::ThreadPool* pool = threadpool::get_threadpool();
  return pool == nullptr ? 0 : static_cast<int>(pool->get_thread_count());
}

int ets_attention_kernel(int want) { return etserve::attention_kernel(want); }

const char* ets_vector_isa(void) { return etserve::kernel_isa(); }  // the CPU tier (cpu_tiers.cpp)

namespace etserve {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

// A decode step reads every cached position of every layer: 80 MB at a 12k
// context. In 4 KB pages that is a TLB miss every 32 positions of each cache,
// and the hardware prefetchers stop at each page's end; in 2 MB pages decode
// attention at 12k measured 6-9% faster (bench/README). Anonymous mappings read
// as zeros, as the runtime's own zero-filled buffers do.
bool PlannedMemory::map(const std::vector<size_t>& sizes) {
  std::vector<Mapping> maps;
  std::vector<executorch::runtime::Span<uint8_t>> spans;
  bool ok = true;
  for (size_t size : sizes) {
    const size_t rounded = (std::max<size_t>(size, 1) + kHugePage - 1) / kHugePage * kHugePage;
    const size_t length = rounded + kHugePage;  // room to start at a 2 MB boundary
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      ok = false;
      break;
    }
    maps.push_back(Mapping{base, length});
    auto* start = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1));
    madvise(start, rounded, MADV_HUGEPAGE);  // a kernel without THP says EINVAL: 4 KB pages, as before
    // Out of core dumps (the caches hold the conversations); and so never merged by the kernel
    // with a neighbouring heap mapping that collapse_loaded advises too, which would make
    // huge_bytes() count the neighbour's pages as ours.
    madvise(base, length, MADV_DONTDUMP);
    spans.emplace_back(start, size);
  }
  if (!ok) {
    for (const Mapping& m : maps) munmap(m.base, m.length);
    return false;
  }
  maps_ = std::move(maps);
  spans_ = std::move(spans);
  allocator_ = std::make_unique<executorch::runtime::HierarchicalAllocator>(
      executorch::runtime::Span<executorch::runtime::Span<uint8_t>>(spans_.data(), spans_.size()));
  return true;
}

PlannedMemory::~PlannedMemory() {
  for (const Mapping& m : maps_) munmap(m.base, m.length);
}

bool PlannedMemory::overlaps(uintptr_t lo, uintptr_t hi) const {
  for (const Mapping& m : maps_) {
    const auto b = reinterpret_cast<uintptr_t>(m.base);
    if (lo < b + m.length && b < hi) return true;
  }
  return false;
}

size_t PlannedMemory::bytes() const {
  size_t total = 0;
  for (const auto& s : spans_) total += s.size();
  return total;
}

size_t PlannedMemory::huge_bytes() const {
  // /proc/self/smaps: a header line per mapping ("start-end perms ..."), then
  // fields such as "AnonHugePages:  4096 kB".
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool ours = false;
  size_t total = 0;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      ours = false;
      for (const Mapping& m : maps_) {
        const auto b = reinterpret_cast<uintptr_t>(m.base);
        if (lo < b + m.length && b < hi) ours = true;
      }
      continue;
    }
    size_t kb = 0;
    if (ours && std::sscanf(line.c_str(), "AnonHugePages: %zu kB", &kb) == 1) total += kb << 10;
  }
  return total;
}

// Anonymous read-write mappings of this process, [start, end) each, from /proc/self/maps.
std::vector<std::pair<uintptr_t, uintptr_t>> anonymous_mappings() {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[8] = {0};
    unsigned long long offset = 0;
    char dev[16] = {0};
    unsigned long long inode = 1;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %llx %15s %llu", &lo, &hi, perms, &offset, dev, &inode) == 6 &&
        inode == 0 && perms[0] == 'r' && perms[1] == 'w' && line.find('[') == std::string::npos)
      out.emplace_back(lo, hi);
  }
  return out;
}

// What loading a model allocated on the heap (the delegate's packed weights: XNNPACK's copy of
// the 8-bit output projection is 136 MB of the 358 MB a Qwen decode step reads) into huge pages,
// as PlannedMemory's buffers are: the anonymous mappings of 4 MB or more that were not there
// before the load, but for PlannedMemory's own (advised already, and not all touched: collapsing
// them would make them resident). MADV_COLLAPSE (Linux 6.1) moves their pages into huge pages
// now; an older kernel refuses it (EINVAL), and so does one without a free huge page to give
// (EAGAIN, ENOMEM: memory fragmented): then each 2 MB piece is tried alone, and khugepaged may do
// the rest later. Returns the bytes collapsed; *refused: the first refusal's errno, 0 if none.
size_t collapse_loaded(const std::vector<std::pair<uintptr_t, uintptr_t>>& before, const PlannedMemory& planned,
                       int* refused) {
  size_t collapsed = 0;
  *refused = 0;
  for (const auto& [lo, hi] : anonymous_mappings()) {
    if (hi - lo < (size_t(4) << 20) || planned.overlaps(lo, hi)) continue;
    bool old = false;
    for (const auto& [blo, bhi] : before) old = old || (blo == lo && bhi == hi);
    if (old) continue;
    const uintptr_t s = (lo + kHugePage - 1) & ~(kHugePage - 1), e = hi & ~(kHugePage - 1);
    if (e <= s) continue;
    madvise(reinterpret_cast<void*>(s), e - s, MADV_HUGEPAGE);
    constexpr int kMadvCollapse = 25;  // <sys/mman.h> names it from glibc 2.37 on
    if (madvise(reinterpret_cast<void*>(s), e - s, kMadvCollapse) == 0) {
      collapsed += e - s;
      continue;
    }
    if (*refused == 0) *refused = errno;
    if (errno == EINVAL) continue;  // no MADV_COLLAPSE in this kernel
    for (uintptr_t p = s; p < e; p += kHugePage)
      if (madvise(reinterpret_cast<void*>(p), kHugePage, kMadvCollapse) == 0) collapsed += kHugePage;
  }
  return collapsed;
}

}  // namespace etserve

ets_model* ets_model_open(const char* path, char* err, size_t err_len) {
  etserve::log_install();
  if (path == nullptr) {
    copy_message(err, err_len, "no model path given");
    return nullptr;
  }
  auto* m = new (std::nothrow) ets_model();
  if (m == nullptr) {
    copy_message(err, err_len, "out of memory");
    return nullptr;
  }
  m->module = std::make_unique<Module>(path, Module::LoadMode::Mmap);
  const auto mappings_before = etserve::anonymous_mappings();
  etserve::log_capture_begin();
  Error e = m->module->load();
  if (e == Error::Ok) {
    // forward's planned buffers in huge pages (PlannedMemory); the runtime's own if that fails
    executorch::runtime::HierarchicalAllocator* planned = nullptr;
    auto meta = m->module->method_meta("forward");
    if (meta.ok()) {
      std::vector<size_t> sizes;
      for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
        auto size = meta->memory_planned_buffer_size(i);
        if (!size.ok() || size.get() < 0) {
          sizes.clear();
          break;
        }
        sizes.push_back(static_cast<size_t>(size.get()));
      }
      if (!sizes.empty() && m->planned.map(sizes)) planned = m->planned.allocator();
    }
    e = m->module->load_method("forward", planned);
  }
  std::string captured = etserve::log_capture_end();
  if (e != Error::Ok) {
    std::string msg = std::string("cannot load ") + path + ": ";
    std::string missing = missing_operators(captured);
    if (!missing.empty()) {
      // Name them and nothing else: the rest of the log says the same at length.
      msg += "the program needs operators this runtime does not have: " + missing;
      captured.clear();
    } else if (e == Error::OperatorMissing) {
      msg += "the program needs operators this runtime does not have";
    } else if (e == Error::AccessFailed) {
      msg += "cannot read the file";
    } else if (e == Error::InvalidProgram) {
      msg += "not a valid ExecuTorch program";
    } else {
      msg += error_text(e);
    }
    if (!captured.empty()) msg += " (" + captured + ")";
    copy_message(err, err_len, msg);
    delete m;
    return nullptr;
  }
  m->loaded_huge_bytes = etserve::collapse_loaded(mappings_before, m->planned, &m->collapse_refused);
  std::string why;
  if (!m->read_metadata(&why)) {
    copy_message(err, err_len, std::string("cannot use ") + path + ": " + why);
    delete m;
    return nullptr;
  }
  return m;
}

void ets_model_close(ets_model* m) { delete m; }

const char* ets_model_error(const ets_model* m) {
  return m == nullptr ? "no model" : m->error.c_str();
}

int ets_model_get_info(const ets_model* m, ets_model_info* out) {
  if (m == nullptr || out == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  *out = m->info;
  return ETS_OK;
}

int ets_forward(ets_model* m, const int64_t* tokens, int64_t n, int64_t start_pos) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  return m->forward(tokens, n, start_pos);
}

int ets_forward_rows(ets_model* m, const int64_t* tokens, const int64_t* positions, const int32_t* slots,
                     int64_t n) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  return m->forward_rows(tokens, positions, slots, n);
}

int ets_use_row(ets_model* m, int64_t row) {
  if (m == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  if (row < 0 || row >= m->n_row_logits) {
    return m->fail(ETS_ERR_OUT_OF_RANGE, "row " + std::to_string(row) + " is not a row of the last rows call (" +
                                             std::to_string(m->n_row_logits) + " rows)");
  }
  const size_t v = static_cast<size_t>(m->info.vocab_size);
  std::memcpy(m->logits.data(), m->row_logits.data() + static_cast<size_t>(row) * v, sizeof(float) * v);
  m->has_logits = true;
  return ETS_OK;
}

int ets_get_logits(ets_model* m, float* out, int64_t n) {
  if (m == nullptr || out == nullptr) return ETS_ERR_INVALID_ARGUMENT;
  if (!m->has_logits) return m->fail(ETS_ERR_STATE, "no forward call has produced logits yet");
  if (n != m->info.vocab_size) {
    return m->fail(ETS_ERR_INVALID_ARGUMENT, "logits buffer must hold vocab_size floats");
  }
  std::memcpy(out, m->logits.data(), sizeof(float) * static_cast<size_t>(n));
  return ETS_OK;
}

int64_t ets_forward_calls(const ets_model* m) { return m == nullptr ? 0 : m->forward_calls; }
int64_t ets_forward_tokens(const ets_model* m) { return m == nullptr ? 0 : m->forward_tokens; }

int ets_model_memory(const ets_model* m, int64_t* planned, int64_t* planned_huge, int64_t* loaded_huge,
                     int64_t* collapse_refused) {
  if (m == nullptr || planned == nullptr || planned_huge == nullptr || loaded_huge == nullptr ||
      collapse_refused == nullptr)
    return ETS_ERR_INVALID_ARGUMENT;
  *loaded_huge = static_cast<int64_t>(m->loaded_huge_bytes);
  *collapse_refused = m->collapse_refused;
  if (m->planned.allocator() == nullptr) {
    *planned = *planned_huge = -1;
    return ETS_OK;
  }
  *planned = static_cast<int64_t>(m->planned.bytes());
  // (a buffer's mapping is rounded up to whole huge pages: count no more than the buffers)
  *planned_huge = static_cast<int64_t>(std::min(m->planned.huge_bytes(), m->planned.bytes()));
  return ETS_OK;
}

}  // extern "C"

int ets_model::fail(int code, const std::string& msg) {
  error = msg;
  return code;
}

bool ets_model::read_metadata(std::string* why) {
  std::memset(&info, 0, sizeof(info));
  info.bos_id = -1;
  auto meta = module->method_meta("forward");
  if (!meta.ok()) {
    *why = "no forward method";
    return false;
  }
  if (meta->num_inputs() < 2 || meta->num_outputs() < 1) {
    *why = "forward must take (tokens, positions) and return logits";
    return false;
  }
  auto tokens_meta = meta->input_tensor_meta(0);
  auto pos_meta = meta->input_tensor_meta(1);
  auto out_meta = meta->output_tensor_meta(0);
  if (!tokens_meta.ok() || !pos_meta.ok() || !out_meta.ok()) {
    *why = "forward inputs or output are not tensors";
    return false;
  }
  if (tokens_meta->scalar_type() != ScalarType::Long || tokens_meta->sizes().size() != 2) {
    *why = "forward's tokens input must be int64 [1, S]";
    return false;
  }
  if (out_meta->scalar_type() != ScalarType::Float) {
    *why = "only float32 logits are supported";
    return false;
  }
  info.logits_dtype = static_cast<int32_t>(out_meta->scalar_type());
  int64_t token_upper = tokens_meta->sizes()[1];
  int64_t pos_upper = pos_meta->sizes().size() == 1 ? pos_meta->sizes()[0] : 1;
  info.positions_are_vector = pos_upper > 1 ? 1 : 0;
  if (meta->num_inputs() >= 3) {  // a rows build: (tokens, positions [S], logits rows [R])
    auto rows_meta = meta->input_tensor_meta(2);
    if (!rows_meta.ok() || rows_meta->scalar_type() != ScalarType::Long ||
        rows_meta->sizes().size() != 1 || !info.positions_are_vector) {
      *why = "forward's third input must be int64 [R] (a rows build) with positions [S]";
      return false;
    }
    info.max_rows = rows_meta->sizes()[0];
  }

  int64_t v = 0;
  if (!read_int_method(*module, "get_vocab_size", &info.vocab_size)) {
    auto sizes = out_meta->sizes();
    info.vocab_size = sizes.empty() ? 0 : sizes[sizes.size() - 1];
  }
  if (!read_int_method(*module, "get_max_seq_len", &info.max_seq_len)) {
    *why = "the file has no get_max_seq_len metadata method";
    return false;
  }
  // ExecuTorch's exporter: get_max_seq_len bounds one call's tokens, get_max_context_len
  // is the KV cache. Ours: max_seq_len is the cache (the tokens bound is max_prefill_len).
  if (read_int_method(*module, "get_max_context_len", &v) && v > 0) info.max_seq_len = v;
  info.max_context_len = info.max_seq_len;
  if (read_int_method(*module, "get_bos_id", &v)) info.bos_id = v;
  if (read_int_method(*module, "use_kv_cache", &v)) info.use_kv_cache = static_cast<int32_t>(v);
  if (read_int_method(*module, "enable_dynamic_shape", &v)) {
    info.dynamic_shape = static_cast<int32_t>(v);
  }
  auto eos = module->execute("get_eos_ids");
  if (eos.ok()) {
    for (const EValue& e : eos.get()) {
      if (e.isInt() && info.n_eos < 8) info.eos_ids[info.n_eos++] = e.toInt();
    }
  } else if (read_int_method(*module, "get_eos_id", &v)) {
    info.eos_ids[info.n_eos++] = v;
  }
  if (info.vocab_size <= 0 || info.max_seq_len <= 0) {
    *why = "vocab size and max sequence length must be positive";
    return false;
  }
  if (!info.use_kv_cache) {
    *why = "the export has no KV cache; re-export with use_kv_cache=True";
    return false;
  }
  info.max_prefill_len = info.dynamic_shape ? token_upper : 1;
  if (info.max_prefill_len < 1) info.max_prefill_len = 1;
  if (info.positions_are_vector && pos_upper < info.max_prefill_len) {
    info.max_prefill_len = pos_upper;
  }
  logits.assign(static_cast<size_t>(info.vocab_size), 0.0f);
  return true;
}

int ets_model::forward(const int64_t* tokens, int64_t n, int64_t start_pos) {
  if (tokens == nullptr || n < 1) return fail(ETS_ERR_INVALID_ARGUMENT, "forward needs at least one token");
  if (n > info.max_prefill_len) {
    return fail(ETS_ERR_OUT_OF_RANGE, "forward got " + std::to_string(n) +
                                          " tokens; this model takes at most " +
                                          std::to_string(info.max_prefill_len) + " per call");
  }
  if (start_pos < 0 || start_pos + n > info.max_seq_len) {
    return fail(ETS_ERR_OUT_OF_RANGE, "positions " + std::to_string(start_pos) + ".." +
                                          std::to_string(start_pos + n - 1) +
                                          " are outside the KV cache of " +
                                          std::to_string(info.max_seq_len));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= info.vocab_size) {
      return fail(ETS_ERR_INVALID_ARGUMENT, "token id " + std::to_string(tokens[i]) +
                                                " is outside the vocabulary");
    }
  }
  token_buf.assign(tokens, tokens + n);
  if (info.positions_are_vector) {
    pos_buf.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos_buf[static_cast<size_t>(i)] = start_pos + i;
  } else {
    pos_buf.assign(1, start_pos);
  }
  out_buf.assign(1, n - 1);
  return run(n, nullptr);
}

int ets_model::forward_rows(const int64_t* tokens, const int64_t* positions, const int32_t* row_slots,
                            int64_t n) {
  if (info.max_rows <= 0) return fail(ETS_ERR_UNSUPPORTED, "this build takes no rows calls (build it again)");
  if (tokens == nullptr || positions == nullptr || row_slots == nullptr || n < 1) {
    return fail(ETS_ERR_INVALID_ARGUMENT, "a rows call needs at least one row");
  }
  if (n > info.max_rows || n > info.max_prefill_len) {
    return fail(ETS_ERR_OUT_OF_RANGE, "a rows call got " + std::to_string(n) + " rows; this model takes at most " +
                                          std::to_string(std::min(info.max_rows, info.max_prefill_len)));
  }
  if (!kv.discovered || kv.caches.empty()) {
    return fail(ETS_ERR_STATE, "the KV caches are not known yet: a plain forward call comes first");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= info.vocab_size) {
      return fail(ETS_ERR_INVALID_ARGUMENT, "token id " + std::to_string(tokens[i]) + " is outside the vocabulary");
    }
    if (positions[i] < 0 || positions[i] >= info.max_seq_len) {
      return fail(ETS_ERR_OUT_OF_RANGE, "position " + std::to_string(positions[i]) +
                                            " is outside the KV cache of " + std::to_string(info.max_seq_len));
    }
    if (row_slots[i] < 0 || row_slots[i] >= slots.count()) {
      return fail(ETS_ERR_OUT_OF_RANGE, "slot " + std::to_string(row_slots[i]) + " does not exist (the model has " +
                                            std::to_string(slots.count()) + ")");
    }
    for (int64_t j = 0; j < i; ++j) {
      if (row_slots[j] == row_slots[i] && positions[j] == positions[i]) {
        return fail(ETS_ERR_INVALID_ARGUMENT, "two rows for position " + std::to_string(positions[i]) +
                                                  " of slot " + std::to_string(row_slots[i]));
      }
    }
  }
  // The program's own checks read row 0's position as the start of n rows.
  if (positions[0] + n > info.max_seq_len) {
    return fail(ETS_ERR_OUT_OF_RANGE, "the first row's position leaves no room for " + std::to_string(n) +
                                          " rows in the KV cache: put a lower position first");
  }
  token_buf.assign(tokens, tokens + n);
  pos_buf.assign(positions, positions + n);
  out_buf.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out_buf[static_cast<size_t>(i)] = i;
  slot_buf.assign(row_slots, row_slots + n);
  etserve::KvRows rows;
  rows.n = n;
  rows.pos = pos_buf.data();
  rows.slot = slot_buf.data();
  return run(n, &rows);
}

int ets_model::run(int64_t n, const etserve::KvRows* rows) {
  auto tokens_t = from_blob(token_buf.data(), {1, static_cast<int32_t>(n)}, ScalarType::Long);
  auto pos_t = from_blob(pos_buf.data(), {static_cast<int32_t>(pos_buf.size())}, ScalarType::Long);
  auto out_t = from_blob(out_buf.data(), {static_cast<int32_t>(out_buf.size())}, ScalarType::Long);

  etserve::KvRecordScope recording(&kv);  // the kernels report the caches they write
  etserve::KvLayoutScope layouts(&kv_layouts);  // and keep or find them in their layouts
  etserve::KvSlotScope slot(&slots);  // in the selected slot's buffers
  etserve::KvRowsScope row_table(rows);  // or, in a rows call, each row's own
  etserve::log_capture_begin();
  auto result = info.max_rows > 0 ? module->forward({EValue(tokens_t), EValue(pos_t), EValue(out_t)})
                                  : module->forward({EValue(tokens_t), EValue(pos_t)});
  std::string captured = etserve::log_capture_end();
  ++forward_calls;
  has_logits = false;
  n_row_logits = 0;
  if (result.ok()) recording.succeeded();
  if (!result.ok()) {
    std::string msg = "forward failed: " + error_text(result.error());
    if (!captured.empty()) msg += " (" + captured + ")";
    return fail(ETS_ERR_RUNTIME, msg);
  }
  forward_tokens += n;
  const EValue& out = result.get()[0];
  if (!out.isTensor()) return fail(ETS_ERR_RUNTIME, "forward returned no tensor");
  const auto& t = out.toTensor();
  const int64_t vocab = info.vocab_size;
  const int64_t want = rows != nullptr ? n : 1;
  if (t.numel() < vocab * want || t.numel() % vocab != 0) {
    return fail(ETS_ERR_RUNTIME, "forward returned logits of an unexpected size");
  }
  if (rows != nullptr) {
    row_logits.resize(static_cast<size_t>(n * vocab));
    std::memcpy(row_logits.data(), t.const_data_ptr<float>() + (t.numel() - n * vocab),
                sizeof(float) * static_cast<size_t>(n * vocab));
    n_row_logits = n;
  }
  // [1, vocab] for the last position, or [1, S, vocab]: the last row is the sampler's.
  const float* data = t.const_data_ptr<float>() + (t.numel() - vocab);
  std::memcpy(logits.data(), data, sizeof(float) * static_cast<size_t>(vocab));
  has_logits = true;
  return ETS_OK;
}
