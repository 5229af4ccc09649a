// libetserve_test.so: entry points for tests/native/test_llm_ops.py, kept out
// of the production library. They wrap raw contiguous buffers into tensors
// and call etserve's kernels the way a loaded program does: looked up by
// operator name in the runtime's kernel registry (libetserve.so, a dependency
// of this library, registers them when it loads) and called boxed, with the
// schema's arguments on an EValue stack. Each returns 0 on success, else the
// ExecuTorch error code the kernel failed with (or -1 when the operator is
// not registered).
//   q, out: [B, S, H, D]; caches: [B, S_max, H_kv, D]
//   mask: NULL or [S, S_max] additive (only with is_causal == 0)
//   scale <= 0: 1/sqrt(D)
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>

#include <cstring>
#include <initializer_list>
#include <optional>
#include <vector>

#define ETS_TEST_API __attribute__((visibility("default")))

namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::OpFunction;
using executorch::runtime::Span;

// A contiguous tensor over a caller's buffer.
struct TensorBuf {
  executorch::aten::SizesType sizes[4];
  executorch::aten::DimOrderType dim_order[4];
  executorch::aten::StridesType strides[4];
  executorch::aten::TensorImpl impl;
  TensorBuf(ScalarType t, std::initializer_list<int64_t> sz, const void* data)
      : impl(t, static_cast<ssize_t>(sz.size()), fill(sz), const_cast<void*>(data),
             dim_order, strides, executorch::aten::TensorShapeDynamism::DYNAMIC_BOUND) {}
  executorch::aten::SizesType* fill(std::initializer_list<int64_t> sz) {
    const int n = static_cast<int>(sz.size());
    int i = 0;
    for (int64_t s : sz) sizes[i++] = static_cast<executorch::aten::SizesType>(s);
    executorch::aten::StridesType st = 1;
    for (i = n - 1; i >= 0; --i) {
      dim_order[i] = static_cast<executorch::aten::DimOrderType>(i);
      strides[i] = st;
      st *= sizes[i];
    }
    return sizes;
  }
  Tensor tensor() { return Tensor(&impl); }
};

// Calls operator `name` with `args` (the schema's arguments, then out).
int call_op(const char* name, std::vector<EValue> args) {
  auto fn = executorch::runtime::get_op_function_from_registry(name);
  if (!fn.ok()) return -1;
  std::vector<EValue*> stack;
  for (EValue& e : args) stack.push_back(&e);
  KernelRuntimeContext ctx;
  (*fn.get())(ctx, Span<EValue*>(stack.data(), stack.size()));
  return static_cast<int>(ctx.failure_state());
}

EValue opt_scale(float scale) { return scale > 0 ? EValue(static_cast<double>(scale)) : EValue(); }

}  // namespace

extern "C" {

ETS_TEST_API int etserve_test_custom_sdpa(const float* q, int B, int S, int H, int D,
                                          const float* k_cache, const float* v_cache,
                                          int S_max, int H_kv, int64_t start_pos,
                                          int is_causal, const float* mask, float scale,
                                          float* out) {
  TensorBuf tq(ScalarType::Float, {B, S, H, D}, q);
  TensorBuf tk(ScalarType::Float, {B, S_max, H_kv, D}, k_cache);
  TensorBuf tv(ScalarType::Float, {B, S_max, H_kv, D}, v_cache);
  TensorBuf to(ScalarType::Float, {B, S, H, D}, out);
  std::optional<TensorBuf> tm;
  if (mask) tm.emplace(ScalarType::Float, std::initializer_list<int64_t>{S, S_max}, mask);
  return call_op("llama::custom_sdpa.out",
                 {EValue(tq.tensor()), EValue(tk.tensor()), EValue(tv.tensor()),
                  EValue(start_pos), tm ? EValue(tm->tensor()) : EValue(), EValue(0.0),
                  EValue(is_causal != 0), opt_scale(scale), EValue(to.tensor())});
}

/* etserve::linear_q4 over x [M, K] -> out [M, N]: weight uint8 [N, K/2], scales int16 [N, K/32],
 * row_sums [N], bias [N] or NULL. `out_n`: the N out is declared with (another value checks
 * that the kernel resizes it). */
ETS_TEST_API int etserve_test_linear_q4(const float* x, int M, int K, const uint8_t* weight,
                                        const int16_t* scales, const float* row_sums,
                                        const float* bias, int N, float* out, int out_n) {
  TensorBuf tx(ScalarType::Float, {M, K}, x);
  TensorBuf tw(ScalarType::Byte, {N, K / 2}, weight);
  TensorBuf ts(ScalarType::Short, {N, K / 32}, scales);
  TensorBuf tr(ScalarType::Float, {N}, row_sums);
  TensorBuf to(ScalarType::Float, {M, out_n}, out);
  std::optional<TensorBuf> tb;
  if (bias) tb.emplace(ScalarType::Float, std::initializer_list<int64_t>{N}, bias);
  return call_op("etserve::linear_q4.out",
                 {EValue(tx.tensor()), EValue(tw.tensor()), EValue(ts.tensor()),
                  EValue(tr.tensor()), tb ? EValue(tb->tensor()) : EValue(),
                  EValue(to.tensor())});
}

/* value: [B, S, H_kv, D] -> cache [B, S_max, H_kv, D] rows start_pos.. */
ETS_TEST_API int etserve_test_update_cache(const float* value, int B, int S, int H_kv, int D,
                                           float* cache, int S_max, int64_t start_pos) {
  TensorBuf tv(ScalarType::Float, {B, S, H_kv, D}, value);
  TensorBuf tc(ScalarType::Float, {B, S_max, H_kv, D}, cache);
  float dummy = 0;
  TensorBuf to(ScalarType::Float, {1}, &dummy);
  return call_op("llama::update_cache.out", {EValue(tv.tensor()), EValue(tc.tensor()),
                                             EValue(start_pos), EValue(to.tensor())});
}

/* update_cache over any element type: `dtype` is the ScalarType of value and
 * cache (e.g. 1 int8/Char, 6 Float). */
ETS_TEST_API int etserve_test_update_cache_typed(int dtype, const void* value, int B, int S,
                                                 int H_kv, int D, void* cache, int S_max,
                                                 int64_t start_pos) {
  const ScalarType t = static_cast<ScalarType>(dtype);
  TensorBuf tv(t, {B, S, H_kv, D}, value);
  TensorBuf tc(t, {B, S_max, H_kv, D}, cache);
  alignas(8) int64_t dummy = 0;
  TensorBuf to(t, {1}, &dummy);
  return call_op("llama::update_cache.out", {EValue(tv.tensor()), EValue(tc.tensor()),
                                             EValue(start_pos), EValue(to.tensor())});
}

/* custom_quantized_sdpa over int8 q [B,S,H,D], caches [B,S_max,H_kv,D], each with
 * float scales and int8 zero points per (b, position, head): [B, S|S_max, H|H_kv]. */
ETS_TEST_API int etserve_test_custom_quantized_sdpa(
    const int8_t* q, const float* q_scale, const int8_t* q_zp, int B, int S, int H, int D,
    const int8_t* k, const float* k_scale, const int8_t* k_zp, const int8_t* v,
    const float* v_scale, const int8_t* v_zp, int S_max, int H_kv, int64_t start_pos,
    int is_causal, const float* mask, float scale, float* out) {
  TensorBuf tq(ScalarType::Char, {B, S, H, D}, q);
  TensorBuf tqs(ScalarType::Float, {B, S, H, 1}, q_scale);
  TensorBuf tqz(ScalarType::Char, {B, S, H, 1}, q_zp);
  TensorBuf tk(ScalarType::Char, {B, S_max, H_kv, D}, k);
  TensorBuf tks(ScalarType::Float, {B, S_max, H_kv, 1}, k_scale);
  TensorBuf tkz(ScalarType::Char, {B, S_max, H_kv, 1}, k_zp);
  TensorBuf tv(ScalarType::Char, {B, S_max, H_kv, D}, v);
  TensorBuf tvs(ScalarType::Float, {B, S_max, H_kv, 1}, v_scale);
  TensorBuf tvz(ScalarType::Char, {B, S_max, H_kv, 1}, v_zp);
  TensorBuf to(ScalarType::Float, {B, S, H, D}, out);
  std::optional<TensorBuf> tm;
  if (mask) tm.emplace(ScalarType::Float, std::initializer_list<int64_t>{S, S_max}, mask);
  return call_op("llama::custom_quantized_sdpa.out",
                 {EValue(tq.tensor()), EValue(tk.tensor()), EValue(tv.tensor()),
                  EValue(start_pos), tm ? EValue(tm->tensor()) : EValue(), EValue(0.0),
                  EValue(is_causal != 0), opt_scale(scale), EValue(tqz.tensor()),
                  EValue(tqs.tensor()), EValue(tkz.tensor()), EValue(tks.tensor()),
                  EValue(tvz.tensor()), EValue(tvs.tensor()), EValue(false),
                  EValue(to.tensor())});
}

/* The fused legacy op: k, v [B, S, H_kv, D] written into the caches, then
 * attention as custom_sdpa. */
ETS_TEST_API int etserve_test_sdpa_with_kv_cache(const float* q, const float* k,
                                                 const float* v, int B, int S, int H, int D,
                                                 float* k_cache, float* v_cache, int S_max,
                                                 int H_kv, int64_t start_pos, int is_causal,
                                                 const float* mask, float scale, float* out) {
  TensorBuf tq(ScalarType::Float, {B, S, H, D}, q);
  TensorBuf tk(ScalarType::Float, {B, S, H_kv, D}, k);
  TensorBuf tv(ScalarType::Float, {B, S, H_kv, D}, v);
  TensorBuf tkc(ScalarType::Float, {B, S_max, H_kv, D}, k_cache);
  TensorBuf tvc(ScalarType::Float, {B, S_max, H_kv, D}, v_cache);
  TensorBuf to(ScalarType::Float, {B, S, H, D}, out);
  std::optional<TensorBuf> tm;
  if (mask) tm.emplace(ScalarType::Float, std::initializer_list<int64_t>{S, S_max}, mask);
  return call_op("llama::sdpa_with_kv_cache.out",
                 {EValue(tq.tensor()), EValue(tk.tensor()), EValue(tv.tensor()),
                  EValue(tkc.tensor()), EValue(tvc.tensor()), EValue(start_pos),
                  EValue(static_cast<int64_t>(S)), tm ? EValue(tm->tensor()) : EValue(),
                  EValue(0.0), EValue(is_causal != 0), opt_scale(scale), EValue(to.tensor())});
}

/* custom_sdpa.out with tensors of ScalarType `dtype` (e.g. 5 Half, 15 BFloat16)
 * over a zeroed scratch buffer: the kernel's error code (non-zero for
 * anything but Float). */
ETS_TEST_API int etserve_test_custom_sdpa_dtype(int dtype) {
  const ScalarType t = static_cast<ScalarType>(dtype);
  alignas(64) static thread_local float scratch[4][64];
  std::memset(scratch, 0, sizeof(scratch));
  TensorBuf tq(t, {1, 1, 2, 8}, scratch[0]);
  TensorBuf tk(t, {1, 2, 1, 8}, scratch[1]);
  TensorBuf tv(t, {1, 2, 1, 8}, scratch[2]);
  TensorBuf to(t, {1, 1, 2, 8}, scratch[3]);
  return call_op("llama::custom_sdpa.out",
                 {EValue(tq.tensor()), EValue(tk.tensor()), EValue(tv.tensor()),
                  EValue(static_cast<int64_t>(0)), EValue(), EValue(0.0), EValue(true),
                  EValue(), EValue(to.tensor())});
}

}  // extern "C"
