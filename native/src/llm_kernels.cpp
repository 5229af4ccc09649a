// The validated kernels behind llm_ops.cpp's registrations: see llm_kernels.h.
#include "llm_kernels.h"

#include "attention.h"
#include "attention_decode.h"
#include "kv_cache.h"
#include "kv_layout.h"
#include "kv_slots.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace etserve {

namespace {

using executorch::aten::ScalarType;
using executorch::runtime::Error;

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "Float";
    case ScalarType::Half: return "Half";
    case ScalarType::BFloat16: return "BFloat16";
    case ScalarType::Double: return "Double";
    case ScalarType::Char: return "Char (int8)";
    case ScalarType::Byte: return "Byte (uint8)";
    case ScalarType::Long: return "Long";
    default: return "another type";
  }
}

bool innermost_contiguous(const Tensor& t) {
  return t.dim() == 0 || t.size(t.dim() - 1) <= 1 || t.strides()[t.dim() - 1] == 1;
}

// Copies value [B,S,H,D] into cache rows start_pos.. (any dtype, both equal).
bool copy_into_cache(KernelRuntimeContext& ctx, const char* op, const Tensor& value,
                     const Tensor& cache, int64_t start_pos) {
  ET_KERNEL_CHECK_MSG(ctx, value.dim() == 4 && cache.dim() == 4, InvalidArgument,
                      false, "%s: value and cache must be 4-D, got %d-D and %d-D", op,
                      (int)value.dim(), (int)cache.dim());
  ET_KERNEL_CHECK_MSG(ctx, value.scalar_type() == cache.scalar_type(), InvalidArgument,
                      false, "%s: value dtype %s differs from cache dtype %s", op,
                      dtype_name(value.scalar_type()), dtype_name(cache.scalar_type()));
  for (int d : {0, 2, 3}) {
    ET_KERNEL_CHECK_MSG(ctx, value.size(d) == cache.size(d), InvalidArgument, false,
                        "%s: value and cache differ in dim %d (%d vs %d)", op, d,
                        (int)value.size(d), (int)cache.size(d));
  }
  const int64_t S = value.size(1), Smax = cache.size(1);
  ET_KERNEL_CHECK_MSG(ctx, innermost_contiguous(value) && innermost_contiguous(cache),
                      InvalidArgument, false, "%s: innermost dim must be contiguous", op);
  const int64_t B = value.size(0), H = value.size(2), D = value.size(3);
  const size_t es = value.element_size();
  const char* src = static_cast<const char*>(value.const_data_ptr());
  if (const KvRows* rows = current_kv_rows()) {  // each row to its own slot and position
    ET_KERNEL_CHECK_MSG(ctx, B == 1 && S == rows->n, InvalidArgument, false,
                        "%s: a rows call's value must be [1, %lld, H, D]", op, (long long)rows->n);
    const auto vs = value.strides();
    const auto cs = cache.strides();
    const KvLayouts* layouts = current_kv_layouts();
    for (int64_t s = 0; s < S; ++s) {
      const int64_t pos = rows->pos[s];
      ET_KERNEL_CHECK_MSG(ctx, pos >= 0 && pos < Smax, InvalidArgument, false,
                          "%s: row %lld's position %lld is outside the cache of %lld rows", op,
                          (long long)s, (long long)pos, (long long)Smax);
      char* dst = static_cast<char*>(kv_resolve_in(cache.mutable_data_ptr(), rows->slot[s]));
      const KvLayout layout = layouts != nullptr ? layouts->of(dst) : KvLayout::kRows;
      const char* vr = src + s * vs[1] * es;
      for (int64_t h = 0; h < H; ++h) {
        const char* from = vr + h * vs[2] * es;
        if (layout != KvLayout::kRows) {
          tiled_write(layout, reinterpret_cast<int8_t*>(dst), H, pos, h,
                      reinterpret_cast<const int8_t*>(from));
        } else {
          std::memcpy(dst + (pos * cs[1] + h * cs[2]) * es, from, D * es);
        }
      }
    }
    return true;
  }
  ET_KERNEL_CHECK_MSG(ctx, start_pos >= 0 && start_pos + S <= Smax, InvalidArgument,
                      false, "%s: rows %lld..%lld outside the cache of %lld rows", op,
                      (long long)start_pos, (long long)(start_pos + S), (long long)Smax);
  char* dst = static_cast<char*>(kv_resolve(cache.mutable_data_ptr()));  // the selected slot's
  const auto vs = value.strides();
  const auto cs = cache.strides();
  const KvLayouts* layouts = current_kv_layouts();
  const KvLayout layout = layouts != nullptr ? layouts->of(dst) : KvLayout::kRows;
  if (layout != KvLayout::kRows) {  // int8 [1, S, H, 64], in the AMX tile's layout
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t h = 0; h < H; ++h)
        tiled_write(layout, reinterpret_cast<int8_t*>(dst), H, start_pos + s, h,
                    reinterpret_cast<const int8_t*>(src + (s * vs[1] + h * vs[2]) * es));
    }
    return true;
  }
  const bool rows_dense = (H <= 1 || (vs[2] == D && cs[2] == D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const char* vr = src + (b * vs[0] + s * vs[1]) * es;
      char* cr = dst + (b * cs[0] + (start_pos + s) * cs[1]) * es;
      if (rows_dense) {
        std::memcpy(cr, vr, H * D * es);
      } else {
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(cr + h * cs[2] * es, vr + h * vs[2] * es, D * es);
      }
    }
  }
  return true;
}

// The int8 operands' quantization parameters (custom_quantized_sdpa): scale
// (float) and zero point (int8) per (batch, position, head), [B, S, H, 1].
struct QuantParams {
  const Tensor* q_zp;
  const Tensor* q_scale;
  const Tensor* k_zp;
  const Tensor* k_scale;
  const Tensor* v_zp;
  const Tensor* v_scale;
};

// Checks one int8 operand's parameters against its shape and fills `x`.
bool quant_operand(KernelRuntimeContext& ctx, const char* op, const char* name, const Tensor& t,
                   const Tensor* zp, const Tensor* sc, AttnOperand* x) {
  ET_KERNEL_CHECK_MSG(ctx, zp != nullptr && sc != nullptr, InvalidArgument, false,
                      "%s: %s needs a scale and a zero point", op, name);
  ET_KERNEL_CHECK_MSG(ctx, sc->scalar_type() == ScalarType::Float &&
                               zp->scalar_type() == ScalarType::Char,
                      InvalidArgument, false,
                      "%s: %s scale must be float32 and zero point int8, got %s and %s", op,
                      name, dtype_name(sc->scalar_type()), dtype_name(zp->scalar_type()));
  for (const Tensor* p : {sc, zp}) {
    ET_KERNEL_CHECK_MSG(ctx, p->dim() == 4 && p->size(0) == t.size(0) &&
                                 p->size(1) == t.size(1) && p->size(2) == t.size(2) &&
                                 p->size(3) == 1,
                        InvalidArgument, false,
                        "%s: %s scale and zero point must be [%lld, %lld, %lld, 1]", op, name,
                        (long long)t.size(0), (long long)t.size(1), (long long)t.size(2));
  }
  const auto ts = t.strides(), ss = sc->strides(), zs = zp->strides();
  // caches (and their scales and zero points) in the selected slot's buffers; the query as it is
  x->i8 = static_cast<const int8_t*>(kv_resolve(t.const_data_ptr()));
  x->sb = ts[0], x->ss = ts[1], x->sh = ts[2];
  x->scale = static_cast<const float*>(kv_resolve(sc->const_data_ptr()));
  x->sc_sb = ss[0], x->sc_ss = ss[1], x->sc_sh = ss[2];
  x->zero_point = static_cast<const int8_t*>(kv_resolve(zp->const_data_ptr()));
  x->zp_sb = zs[0], x->zp_ss = zs[1], x->zp_sh = zs[2];
  return true;
}

void f32_operand(const Tensor& t, AttnOperand* x) {
  const auto ts = t.strides();
  x->f32 = static_cast<const float*>(kv_resolve(t.const_data_ptr()));  // a cache: the slot's
  x->sb = ts[0], x->ss = ts[1], x->sh = ts[2];
}

// The layout a model's int8 caches are read in (kv_layout.h): the tiled one
// while the AMX kernel attends, or where the tier's decode kernel reads tiles
// (attention_decode.h: AVX2), when the caches are whole [1, S, Hkv, 64]
// tensors with S a multiple of 64; else rows. Converts them in place when the
// kernel changed, and tells the operands. Only the blocks holding the first `written` positions
// (the call's own rows and all before them: all a cache can hold before its first attention,
// what update_cache, a restore or a slot copy wrote) are converted: the rest of a slot's cache
// is pages never touched, which a conversion would make resident (and the KV budget would
// count), or rows no call reads before writing them again in the new layout.
void choose_layouts(const Tensor& kc, const Tensor& vc, int64_t written, AttnOperand* k, AttnOperand* v) {
  KvLayouts* layouts = current_kv_layouts();
  if (layouts == nullptr) return;  // a kernel called on its own: rows
  const int64_t S = kc.size(1), H = kc.size(2), D = kc.size(3);
  auto dense = [&](const Tensor& t) {
    const auto st = t.strides();
    return st[3] == 1 && st[2] == D && st[1] == H * D;
  };
  const bool want = (attention_kernel(-1) == 1 || decode_reads_tiles()) && D == 64 && kc.size(0) == 1 &&
                    S % kLayoutBlock == 0 && dense(kc) && dense(vc) &&
                    kc.const_data_ptr() != vc.const_data_ptr();
  const struct {
    const Tensor* t;
    AttnOperand* x;
    KvLayout tiled;
  } caches[2] = {{&kc, k, KvLayout::kKeyTiles}, {&vc, v, KvLayout::kValueTiles}};
  for (const auto& c : caches) {
    int8_t* data = static_cast<int8_t*>(kv_resolve(c.t->mutable_data_ptr()));
    const KvLayout now = layouts->of(data);
    const KvLayout to = want ? c.tiled : KvLayout::kRows;
    if (now != to) {
      const int64_t n = std::min(S, (written + kLayoutBlock - 1) / kLayoutBlock * kLayoutBlock);
      if (now != KvLayout::kRows) to_rows(now, data, n, H);
      if (to != KvLayout::kRows) to_tiled(to, data, n, H);
      layouts->set(data, to, S, H);
      ET_LOG(Info, "etserve: int8 KV cache of %lld positions to %s", static_cast<long long>(S),
             to == KvLayout::kRows ? "rows" : "tiles");
    }
    c.x->tiled = static_cast<int>(to);
    c.x->hkv = H;
  }
}

// Validates and runs attention of q over the caches with `n_kv_nomask` keys
// visible when there is no mask (all cache rows with one). fp32 operands
// without `qp`, int8 ones with it.
void attention_checked(KernelRuntimeContext& ctx, const char* op, const Tensor& q,
                       const Tensor& kc, const Tensor& vc, int64_t start_pos,
                       int64_t n_kv_nomask, const std::optional<Tensor>& mask,
                       bool is_causal, const std::optional<double>& scale, Tensor& out,
                       const QuantParams* qp = nullptr) {
  ET_KERNEL_CHECK_MSG(ctx, q.dim() == 4 && kc.dim() == 4 && vc.dim() == 4, InvalidArgument, ,
                      "%s: query and caches must be 4-D", op);
  const ScalarType want = qp ? ScalarType::Char : ScalarType::Float;
  for (const Tensor* t : {&q, &kc, &vc}) {
    ET_KERNEL_CHECK_MSG(ctx, t->scalar_type() == want, InvalidArgument, ,
                        "%s: query and caches must be %s for etserve's kernels, got %s%s", op,
                        qp ? "int8" : "float32", dtype_name(t->scalar_type()),
                        qp ? "" : " (export the model in fp32)");
  }
  ET_KERNEL_CHECK_MSG(ctx, out.scalar_type() == ScalarType::Float, InvalidArgument, ,
                      "%s: only float32 output is supported by etserve's kernels, got %s", op,
                      dtype_name(out.scalar_type()));
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Smax = kc.size(1), Hkv = kc.size(2);
  ET_KERNEL_CHECK_MSG(ctx, kc.size(0) == B && vc.size(0) == B && kc.size(3) == D &&
                               vc.size(1) == Smax && vc.size(2) == Hkv && vc.size(3) == D,
                      InvalidArgument, , "%s: query/key/value shapes do not match", op);
  ET_KERNEL_CHECK_MSG(ctx, Hkv > 0 && H % Hkv == 0, InvalidArgument, ,
                      "%s: %lld query heads not a multiple of %lld kv heads", op,
                      (long long)H, (long long)Hkv);
  ET_KERNEL_CHECK_MSG(ctx, innermost_contiguous(q) && innermost_contiguous(kc) &&
                               innermost_contiguous(vc),
                      InvalidArgument, , "%s: innermost dim must be contiguous", op);
  ET_KERNEL_CHECK_MSG(ctx, start_pos >= 0, InvalidArgument, , "%s: start_pos %lld < 0", op,
                      (long long)start_pos);
  const float* mp = nullptr;
  int64_t mask_ss = 0;
  int64_t n_kv = n_kv_nomask;
  if (mask.has_value()) {
    const Tensor& m = *mask;
    ET_KERNEL_CHECK_MSG(ctx, !is_causal, InvalidArgument, ,
                        "%s: attn_mask and is_causal cannot both be set", op);
    ET_KERNEL_CHECK_MSG(ctx, m.scalar_type() == ScalarType::Float, InvalidArgument, ,
                        "%s: attn_mask must be float32, got %s", op,
                        dtype_name(m.scalar_type()));
    ET_KERNEL_CHECK_MSG(ctx, m.dim() == 2 && m.size(0) == S && m.size(1) == Smax &&
                                 innermost_contiguous(m),
                        InvalidArgument, , "%s: attn_mask must be [%lld, %lld]", op,
                        (long long)S, (long long)Smax);
    mp = m.const_data_ptr<float>();
    mask_ss = m.strides()[0];
    n_kv = Smax;
  } else {
    ET_KERNEL_CHECK_MSG(ctx, n_kv <= Smax, InvalidArgument, ,
                        "%s: start_pos %lld + seq_len %lld exceeds the cache (%lld)", op,
                        (long long)start_pos, (long long)(n_kv - start_pos), (long long)Smax);
  }
  ET_KERNEL_CHECK_MSG(
      ctx, executorch::runtime::resize_tensor(out, q.sizes()) == Error::Ok, InvalidArgument, ,
      "%s: cannot resize out to the query's shape", op);
  ET_KERNEL_CHECK_MSG(ctx, innermost_contiguous(out), InvalidArgument, ,
                      "%s: out innermost dim must be contiguous", op);
  if (q.numel() == 0) return;
  const auto os = out.strides();

  // Query rows [r0, r0 + n_rows) at positions start.., over the first `keys` positions of the
  // caches (in the slot kv_resolve gives now). The call's rows end at position `written`
  // (a mask may let them see more keys than that: none was written there).
  const KvRows* rows = current_kv_rows();
  int64_t written = start_pos + S;
  if (rows != nullptr)
    for (int64_t r = 0; r < rows->n; ++r) written = std::max(written, rows->pos[r] + 1);
  auto attend = [&](int64_t r0, int64_t n_rows, int64_t start, int64_t keys) -> bool {
    AttnArgs a;
    if (qp) {
      if (!quant_operand(ctx, op, "query", q, qp->q_zp, qp->q_scale, &a.q) ||
          !quant_operand(ctx, op, "key", kc, qp->k_zp, qp->k_scale, &a.k) ||
          !quant_operand(ctx, op, "value", vc, qp->v_zp, qp->v_scale, &a.v))
        return false;
      choose_layouts(kc, vc, written, &a.k, &a.v);
      a.q.i8 += r0 * a.q.ss;
      a.q.scale += r0 * a.q.sc_ss;
      a.q.zero_point += r0 * a.q.zp_ss;
    } else {
      f32_operand(q, &a.q);
      f32_operand(kc, &a.k);
      f32_operand(vc, &a.v);
      a.q.f32 += r0 * a.q.ss;
    }
    a.o = out.mutable_data_ptr<float>() + r0 * os[1];
    a.o_sb = os[0], a.o_ss = os[1], a.o_sh = os[2];
    a.B = B, a.S = n_rows, a.H = H, a.Hkv = Hkv, a.D = D;
    a.n_kv = keys;
    a.start_pos = start;
    a.causal = is_causal;
    a.mask = mp;
    a.mask_ss = mask_ss;
    a.scale = scale.has_value() ? static_cast<float>(*scale)
                                : 1.0f / std::sqrt(static_cast<float>(D));
    run_attention(a);
    return true;
  };

  if (rows == nullptr) {
    attend(0, S, start_pos, n_kv);
    return;
  }
  // A rows call: each row attends over its own slot up to its own position, through the kernel
  // of a decode step (a draft's rows see the rows before them, written by update_cache first).
  // Row by row, not a draft's rows as one chunk: a chunk rounds differently from a decode step,
  // and a verified draft must give the tokens plain decoding gives, bit for bit.
  ET_KERNEL_CHECK_MSG(ctx, B == 1 && S == rows->n && !mask.has_value() && is_causal,
                      InvalidArgument, , "%s: a rows call needs a causal, mask-free [1, %lld, H, D] query",
                      op, (long long)rows->n);
  for (int64_t r = 0; r < S; ++r) {
    const int64_t pos = rows->pos[r];
    ET_KERNEL_CHECK_MSG(ctx, pos >= 0 && pos < Smax, InvalidArgument, ,
                        "%s: row %lld's position %lld is outside the cache (%lld)", op, (long long)r,
                        (long long)pos, (long long)Smax);
    KvSlotOverride in_slot(rows->slot[r]);
    if (!attend(r, 1, pos, pos + 1)) return;
  }
}

}  // namespace

Tensor& update_cache_out(KernelRuntimeContext& ctx, const Tensor& value,
                         const Tensor& cache, int64_t start_pos, Tensor& out) {
  kv_observe(cache, "llama::update_cache");
  copy_into_cache(ctx, "llama::update_cache", value, cache, start_pos);
  return out;  // the op's output is a placeholder; nothing reads it
}

Tensor& update_cache_with_indices_out(KernelRuntimeContext& ctx, const Tensor& value,
                                      const Tensor& cache, int64_t start_pos,
                                      const Tensor& indices, Tensor& out) {
  (void)start_pos;
  const char* op = "llama::update_cache_with_indices";
  kv_observe_indexed(op);
  ET_KERNEL_CHECK_MSG(ctx, value.dim() == 4 && cache.dim() == 4, InvalidArgument, out,
                      "%s: value and cache must be 4-D", op);
  ET_KERNEL_CHECK_MSG(ctx, value.scalar_type() == cache.scalar_type(), InvalidArgument,
                      out, "%s: value and cache dtypes differ", op);
  ET_KERNEL_CHECK_MSG(ctx, value.size(0) == cache.size(0) && value.size(2) == cache.size(2) &&
                               value.size(3) == cache.size(3),
                      InvalidArgument, out, "%s: value and cache shapes differ", op);
  ET_KERNEL_CHECK_MSG(ctx, indices.scalar_type() == ScalarType::Long && indices.dim() == 2 &&
                               indices.size(0) == value.size(0) &&
                               indices.size(1) == value.size(1),
                      InvalidArgument, out, "%s: indices must be int64 [B, S]", op);
  ET_KERNEL_CHECK_MSG(ctx, innermost_contiguous(value) && innermost_contiguous(cache),
                      InvalidArgument, out, "%s: innermost dim must be contiguous", op);
  const int64_t B = value.size(0), S = value.size(1), H = value.size(2), D = value.size(3);
  const int64_t Smax = cache.size(1);
  const size_t es = value.element_size();
  const int64_t* idx = indices.const_data_ptr<int64_t>();
  const auto is = indices.strides();
  const auto vs = value.strides();
  const auto cs = cache.strides();
  const char* src = static_cast<const char*>(value.const_data_ptr());
  char* dst = static_cast<char*>(cache.mutable_data_ptr());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t pos = idx[b * is[0] + s * is[1]];
      ET_KERNEL_CHECK_MSG(ctx, pos >= 0 && pos < Smax, InvalidArgument, out,
                          "%s: index %lld outside the cache of %lld rows", op,
                          (long long)pos, (long long)Smax);
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(dst + (b * cs[0] + pos * cs[1] + h * cs[2]) * es,
                    src + (b * vs[0] + s * vs[1] + h * vs[2]) * es, D * es);
    }
  }
  return out;
}

Tensor& custom_sdpa_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k,
                        const Tensor& v, int64_t start_pos,
                        const std::optional<Tensor>& mask, double dropout_p,
                        bool is_causal, const std::optional<double>& scale, Tensor& out) {
  (void)dropout_p;  // inference: ignored, as in the reference kernel
  const int64_t S = q.dim() == 4 ? q.size(1) : 0;
  attention_checked(ctx, "llama::custom_sdpa", q, k, v, start_pos, start_pos + S, mask,
                    is_causal, scale, out);
  return out;
}

Tensor& sdpa_with_kv_cache_out(KernelRuntimeContext& ctx, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& k_cache,
                               const Tensor& v_cache, int64_t start_pos, int64_t seq_len,
                               const std::optional<Tensor>& mask, double dropout_p,
                               bool is_causal, const std::optional<double>& scale,
                               Tensor& out) {
  (void)dropout_p;
  const char* op = "llama::sdpa_with_kv_cache";
  for (const Tensor* t : {&q, &k, &v}) {
    ET_KERNEL_CHECK_MSG(ctx, t->scalar_type() == ScalarType::Float, InvalidArgument, out,
                        "%s: only float32 is supported by etserve's kernels, got %s", op,
                        dtype_name(t->scalar_type()));
  }
  ET_KERNEL_CHECK_MSG(ctx, k.dim() == 4 && k.size(1) == seq_len, InvalidArgument, out,
                      "%s: key must be [B, seq_len=%lld, H_kv, D]", op, (long long)seq_len);
  kv_observe(k_cache, op);
  kv_observe(v_cache, op);
  if (!copy_into_cache(ctx, op, k, k_cache, start_pos)) return out;
  if (!copy_into_cache(ctx, op, v, v_cache, start_pos)) return out;
  attention_checked(ctx, op, q, k_cache, v_cache, start_pos, start_pos + seq_len, mask,
                    is_causal, scale, out);
  return out;
}

Tensor& custom_quantized_sdpa_out(
    KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
    int64_t start_pos, const std::optional<Tensor>& mask, double dropout_p, bool is_causal,
    const std::optional<double>& scale, const std::optional<Tensor>& q_zero_points,
    const std::optional<Tensor>& q_scales, const std::optional<Tensor>& k_zero_points,
    const std::optional<Tensor>& k_scales, const std::optional<Tensor>& v_zero_points,
    const std::optional<Tensor>& v_scales, bool is_seq_at_dim_2, Tensor& out) {
  (void)dropout_p;
  const char* op = "llama::custom_quantized_sdpa";
  ET_KERNEL_CHECK_MSG(ctx, !is_seq_at_dim_2, InvalidArgument, out,
                      "%s: only [B, S, H, D] operands (is_seq_at_dim_2=False) are supported",
                      op);
  auto p = [](const std::optional<Tensor>& t) { return t.has_value() ? &*t : nullptr; };
  const QuantParams qp{p(q_zero_points), p(q_scales), p(k_zero_points),
                       p(k_scales),      p(v_zero_points), p(v_scales)};
  const int64_t S = q.dim() == 4 ? q.size(1) : 0;
  attention_checked(ctx, op, q, k, v, start_pos, start_pos + S, mask, is_causal, scale, out,
                    &qp);
  return out;
}

}  // namespace etserve
