// Registers etserve's kernels (llm_kernels.h) for ExecuTorch's LLM custom
// operators with the runtime's kernel registry when libetserve.so loads:
// boxed wrappers that unpack the operator schema's arguments.
#include "llm_ops.h"

#include "linear_q4.h"
#include "llm_kernels.h"

#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>

#include <optional>

namespace {

using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::Kernel;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;
using namespace etserve;

// Boxed wrappers: stack = the schema's arguments in order, then `out`.

std::optional<Tensor> opt_tensor(EValue* e) {
  if (e->isNone()) return std::nullopt;
  return e->toTensor();
}

double as_double(EValue* e, double dflt) {
  if (e->isDouble()) return e->toDouble();
  if (e->isInt()) return static_cast<double>(e->toInt());
  return dflt;
}

std::optional<double> opt_double(EValue* e) {
  if (e->isDouble()) return e->toDouble();
  if (e->isInt()) return static_cast<double>(e->toInt());
  return std::nullopt;
}

bool as_bool(EValue* e) {
  if (e->isBool()) return e->toBool();
  if (e->isInt()) return e->toInt() != 0;
  return false;
}

bool check_stack(KernelRuntimeContext& ctx, Span<EValue*> stack, size_t need,
                 const char* op) {
  if (stack.size() < need) {
    ET_LOG(Error, "%s: expected %zu arguments, got %zu", op, need, stack.size());
    ctx.fail(Error::InvalidProgram);
    return false;
  }
  return true;
}

// Fails the call unless every argument at `idx` satisfies `ok` (e.g. isTensor).
bool args_are(KernelRuntimeContext& ctx, Span<EValue*> stack, std::initializer_list<size_t> idx,
              const char* op, bool (EValue::*ok)() const, const char* kind) {
  for (size_t i : idx) {
    if (!(stack[i]->*ok)()) {
      ET_LOG(Error, "%s: argument %zu is not %s", op, i, kind);
      ctx.fail(Error::InvalidProgram);
      return false;
    }
  }
  return true;
}

bool is_tensor_args(KernelRuntimeContext& ctx, Span<EValue*> stack,
                    std::initializer_list<size_t> idx, const char* op) {
  return args_are(ctx, stack, idx, op, &EValue::isTensor, "a tensor");
}

bool is_int_args(KernelRuntimeContext& ctx, Span<EValue*> stack,
                 std::initializer_list<size_t> idx, const char* op) {
  return args_are(ctx, stack, idx, op, &EValue::isInt, "an int");
}

// update_cache.out(Tensor value, Tensor(a!) cache, SymInt start_pos, *, Tensor(b!) out)
void boxed_update_cache(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const char* op = "llama::update_cache.out";
  if (!check_stack(ctx, stack, 4, op) || !is_tensor_args(ctx, stack, {0, 1, 3}, op) ||
      !is_int_args(ctx, stack, {2}, op))
    return;
  update_cache_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toInt(),
                   stack[3]->toTensor());
}

// update_cache_with_indices.out(Tensor value, Tensor(a!) cache, SymInt start_pos,
//                               Tensor indices, *, Tensor(b!) out)
void boxed_update_cache_with_indices(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const char* op = "llama::update_cache_with_indices.out";
  if (!check_stack(ctx, stack, 5, op) || !is_tensor_args(ctx, stack, {0, 1, 3, 4}, op) ||
      !is_int_args(ctx, stack, {2}, op))
    return;
  update_cache_with_indices_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(),
                                stack[2]->toInt(), stack[3]->toTensor(),
                                stack[4]->toTensor());
}

// custom_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos,
//   Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False,
//   float? scale=None, *, Tensor(a!) out)
void boxed_custom_sdpa(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const char* op = "llama::custom_sdpa.out";
  if (!check_stack(ctx, stack, 9, op) || !is_tensor_args(ctx, stack, {0, 1, 2, 8}, op) ||
      !is_int_args(ctx, stack, {3}, op))
    return;
  custom_sdpa_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toTensor(),
                  stack[3]->toInt(), opt_tensor(stack[4]), as_double(stack[5], 0.0),
                  as_bool(stack[6]), opt_double(stack[7]), stack[8]->toTensor());
}

// sdpa_with_kv_cache.out(Tensor query, Tensor key, Tensor value, Tensor(a!) key_cache,
//   Tensor(b!) value_cache, SymInt start_pos, SymInt seq_len, Tensor? attn_mask=None,
//   float drpout_p=0., bool is_causal=False, float? scale=None, *, Tensor(c!) out)
void boxed_sdpa_with_kv_cache(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const char* op = "llama::sdpa_with_kv_cache.out";
  if (!check_stack(ctx, stack, 12, op) ||
      !is_tensor_args(ctx, stack, {0, 1, 2, 3, 4, 11}, op) ||
      !is_int_args(ctx, stack, {5, 6}, op))
    return;
  sdpa_with_kv_cache_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(),
                         stack[2]->toTensor(), stack[3]->toTensor(), stack[4]->toTensor(),
                         stack[5]->toInt(), stack[6]->toInt(), opt_tensor(stack[7]),
                         as_double(stack[8], 0.0), as_bool(stack[9]), opt_double(stack[10]),
                         stack[11]->toTensor());
}

// custom_quantized_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos,
//   Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None,
//   Tensor? q_zero_points=None, Tensor? q_scales=None, Tensor? k_zero_points=None,
//   Tensor? k_scales=None, Tensor? v_zero_points=None, Tensor? v_scales=None,
//   bool is_seq_at_dim_2=False, *, Tensor(a!) out)
void boxed_custom_quantized_sdpa(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const char* op = "llama::custom_quantized_sdpa.out";
  if (!check_stack(ctx, stack, 16, op) || !is_tensor_args(ctx, stack, {0, 1, 2, 15}, op) ||
      !is_int_args(ctx, stack, {3}, op))
    return;
  custom_quantized_sdpa_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(),
                            stack[2]->toTensor(), stack[3]->toInt(), opt_tensor(stack[4]),
                            as_double(stack[5], 0.0), as_bool(stack[6]), opt_double(stack[7]),
                            opt_tensor(stack[8]), opt_tensor(stack[9]), opt_tensor(stack[10]),
                            opt_tensor(stack[11]), opt_tensor(stack[12]), opt_tensor(stack[13]),
                            as_bool(stack[14]), stack[15]->toTensor());
}

// linear_q4.out(Tensor input, Tensor weight, Tensor scales, Tensor row_sums,
//               Tensor? bias, *, Tensor(a!) out)
void boxed_linear_q4(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const char* op = "etserve::linear_q4.out";
  if (!check_stack(ctx, stack, 6, op) || !is_tensor_args(ctx, stack, {0, 1, 2, 3, 5}, op)) return;
  linear_q4_out(ctx, stack[0]->toTensor(), stack[1]->toTensor(), stack[2]->toTensor(),
                stack[3]->toTensor(), opt_tensor(stack[4]), stack[5]->toTensor());
}

const Kernel kKernels[] = {
    Kernel("llama::update_cache.out", boxed_update_cache),
    Kernel("llama::update_cache_with_indices.out", boxed_update_cache_with_indices),
    Kernel("llama::custom_sdpa.out", boxed_custom_sdpa),
    Kernel("llama::sdpa_with_kv_cache.out", boxed_sdpa_with_kv_cache),
    Kernel("llama::custom_quantized_sdpa.out", boxed_custom_quantized_sdpa),
    Kernel("etserve::linear_q4.out", boxed_linear_q4),
};

bool register_all() {
  bool ok = true;
  // One at a time: a name somebody else registered first must not keep the
  // others out.
  for (const Kernel& k : kKernels) {
    Error e = executorch::runtime::register_kernel(k);
    if (e != Error::Ok) {
      ET_LOG(Error, "etserve: registering %s failed (error 0x%x)", k.name_,
             static_cast<unsigned>(e));
      ok = false;
    }
  }
  return ok;
}

const bool g_registered = register_all();

}  // namespace

// The registered operators' names are listed by the test library
// (native/test/llm_ops_test.cpp: etserve_llm_op_*), from the runtime's registry.
