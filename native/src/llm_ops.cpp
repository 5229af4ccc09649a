// etserve's kernels for ExecuTorch's LLM custom operators, registered with the
// runtime so that .pte files exported with `use_sdpa_with_kv_cache=True` run
// without the torch-linked libcustom_ops_aot_lib.
//
// Semantics (checked against the wheel's own kernels):
//   update_cache(value [B,S,Hkv,D], cache [B,Smax,Hkv,D], start_pos):
//     cache[:, start_pos:start_pos+S] = value, in place; `out` is untouched.
//   custom_sdpa(q [B,S,H,D], k_cache, v_cache [B,Smax,Hkv,D], start_pos,
//               attn_mask, dropout (ignored), is_causal, scale):
//     without a mask, keys 0 .. start_pos+S-1 are visible; with is_causal,
//     query row i (absolute position start_pos+i) sees keys 0..start_pos+i.
//     With a mask ([S, Smax] additive float), every cache row is visible and
//     the mask decides; a mask together with is_causal is refused.
//     Query head h reads kv head h / (H/Hkv). scale defaults to 1/sqrt(D).
//   sdpa_with_kv_cache(q, k, v, k_cache, v_cache, start_pos, seq_len, ...):
//     update_cache for k and v, then attention as above over start_pos+seq_len
//     keys (all Smax with a mask).
//
// The cache-writing kernels also report the cache tensors they are handed to
// the running forward call's KV recorder (kv_cache.h): that is how the runtime
// finds a model's caches for session snapshots without names in the .pte.
#include "llm_ops.h"

#include "kv_cache.h"

#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ETS_AVX2 1
#endif

namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::Kernel;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

// ---------------------------------------------------------------------------
// Vector helpers over contiguous floats.

#ifdef ETS_AVX2
inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (softmax arguments), Cephes-style: x = n ln2 + r,
// degree-6 polynomial for e^r, 2^n through the exponent bits. Relative error
// ~2e-7; inputs below -87 (including -inf) give ~1e-38 instead of 0.
inline __m256 exp256(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 hi = _mm256_set1_ps(88.0f);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#ifdef ETS_AVX2
// Eight horizontal sums packed into one vector: lane r = sum of a[r].
inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                      __m256 a5, __m256 a6, __m256 a7) {
  __m256 s01 = _mm256_hadd_ps(a0, a1);  // a0 01,23 a1 01,23 | a0 45,67 a1 45,67
  __m256 s23 = _mm256_hadd_ps(a2, a3);
  __m256 s45 = _mm256_hadd_ps(a4, a5);
  __m256 s67 = _mm256_hadd_ps(a6, a7);
  __m256 s0123 = _mm256_hadd_ps(s01, s23);  // lanes: a0 a1 a2 a3 (low halves) | (high)
  __m256 s4567 = _mm256_hadd_ps(s45, s67);
  __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
  __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  return _mm256_add_ps(lo, hi);
}
#endif

// res[r] = dot(q, k + r * ks) for r in 0..8.
inline void dot8(const float* q, const float* k, int64_t ks, int64_t D, float* res) {
  int64_t d = 0;
#ifdef ETS_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  __m256 a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps();
  __m256 a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
  for (; d + 8 <= D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    const float* kd = k + d;
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + ks), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + 2 * ks), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + 3 * ks), a3);
    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + 4 * ks), a4);
    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + 5 * ks), a5);
    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + 6 * ks), a6);
    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kd + 7 * ks), a7);
  }
  _mm256_storeu_ps(res, hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7));
#else
  for (int r = 0; r < 8; ++r) res[r] = 0.f;
#endif
  for (; d < D; ++d) {
    const float qd = q[d];
    for (int r = 0; r < 8; ++r) res[r] += qd * k[r * ks + d];
  }
}

inline float dot1(const float* q, const float* k, int64_t D) {
  int64_t d = 0;
  float s = 0;
#ifdef ETS_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; d + 16 <= D; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
  }
  for (; d + 8 <= D; d += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
  s = hsum256(_mm256_add_ps(a0, a1));
#endif
  for (; d < D; ++d) s += q[d] * k[d];
  return s;
}

// Adds m[0..n) to p (if m) and returns max(p).
inline float add_max(float* p, const float* m, int64_t n) {
  int64_t j = 0;
  float mx = -INFINITY;
#ifdef ETS_AVX2
  __m256 vm = _mm256_set1_ps(-INFINITY);
  if (m) {
    for (; j + 8 <= n; j += 8) {
      __m256 x = _mm256_add_ps(_mm256_loadu_ps(p + j), _mm256_loadu_ps(m + j));
      _mm256_storeu_ps(p + j, x);
      vm = _mm256_max_ps(vm, x);
    }
  } else {
    for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(p + j));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  mx = _mm_cvtss_f32(h);
#endif
  for (; j < n; ++j) {
    if (m) p[j] += m[j];
    mx = std::max(mx, p[j]);
  }
  return mx;
}

// p[j] = exp(p[j] - mx) in place; returns the sum.
inline float exp_shift_sum(float* p, int64_t n, float mx) {
  int64_t j = 0;
  float sum = 0;
#ifdef ETS_AVX2
  __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), m));
    _mm256_storeu_ps(p + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum256(acc);
#endif
  for (; j < n; ++j) {
    float e = std::exp(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  return sum;
}

// o[0..D) += sum_j p[j] * v(j)[0..D), v(j) = v + j * vs.
inline void weighted_acc(const float* p, int64_t n, const float* v, int64_t vs,
                         int64_t D, float* o) {
  int64_t d = 0;
#ifdef ETS_AVX2
  for (; d + 64 <= D; d += 64) {
    __m256 a0 = _mm256_loadu_ps(o + d), a1 = _mm256_loadu_ps(o + d + 8);
    __m256 a2 = _mm256_loadu_ps(o + d + 16), a3 = _mm256_loadu_ps(o + d + 24);
    __m256 a4 = _mm256_loadu_ps(o + d + 32), a5 = _mm256_loadu_ps(o + d + 40);
    __m256 a6 = _mm256_loadu_ps(o + d + 48), a7 = _mm256_loadu_ps(o + d + 56);
    const float* vp = v + d;
    for (int64_t j = 0; j < n; ++j, vp += vs) {
      const __m256 pj = _mm256_broadcast_ss(p + j);
      a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 8), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 16), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 24), a3);
      a4 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 32), a4);
      a5 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 40), a5);
      a6 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 48), a6);
      a7 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 56), a7);
    }
    _mm256_storeu_ps(o + d, a0);
    _mm256_storeu_ps(o + d + 8, a1);
    _mm256_storeu_ps(o + d + 16, a2);
    _mm256_storeu_ps(o + d + 24, a3);
    _mm256_storeu_ps(o + d + 32, a4);
    _mm256_storeu_ps(o + d + 40, a5);
    _mm256_storeu_ps(o + d + 48, a6);
    _mm256_storeu_ps(o + d + 56, a7);
  }
  for (; d + 32 <= D; d += 32) {
    __m256 a0 = _mm256_loadu_ps(o + d), a1 = _mm256_loadu_ps(o + d + 8);
    __m256 a2 = _mm256_loadu_ps(o + d + 16), a3 = _mm256_loadu_ps(o + d + 24);
    const float* vp = v + d;
    for (int64_t j = 0; j < n; ++j, vp += vs) {
      const __m256 pj = _mm256_broadcast_ss(p + j);
      a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 8), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 16), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp + 24), a3);
    }
    _mm256_storeu_ps(o + d, a0);
    _mm256_storeu_ps(o + d + 8, a1);
    _mm256_storeu_ps(o + d + 16, a2);
    _mm256_storeu_ps(o + d + 24, a3);
  }
  for (; d + 8 <= D; d += 8) {
    __m256 a0 = _mm256_loadu_ps(o + d);
    const float* vp = v + d;
    for (int64_t j = 0; j < n; ++j, vp += vs)
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(vp), a0);
    _mm256_storeu_ps(o + d, a0);
  }
#endif
  if (d < D) {
    const int64_t rest = D - d;
    const float* vp = v + d;
    for (int64_t j = 0; j < n; ++j, vp += vs) {
      const float pj = p[j];
      for (int64_t t = 0; t < rest; ++t) o[d + t] += pj * vp[t];
    }
  }
}

// ---------------------------------------------------------------------------
// Attention core over strided fp32 views (innermost dimension contiguous).

struct AttnArgs {
  const float* q;
  int64_t q_sb, q_ss, q_sh;
  const float* k;
  int64_t k_sb, k_ss, k_sh;
  const float* v;
  int64_t v_sb, v_ss, v_sh;
  float* o;
  int64_t o_sb, o_ss, o_sh;
  int64_t B, S, H, Hkv, D;
  int64_t n_kv;       // keys visible to every row before the causal cut
  int64_t start_pos;  // absolute position of query row 0
  bool causal;
  const float* mask;  // nullable, [S, >= n_kv] with row stride mask_ss
  int64_t mask_ss;
  float scale;
};

// Attention of the G query heads that share kv head g, for query row i of
// batch b, over keys [j0, j1) (cut further by the causal limit). The heads of
// a group are processed together block by block so that each key/value row
// is fetched from memory once and reused from L1 by all G heads.
//   p: scratch of G * (j1 - j0) floats.
//   Without `partial`: writes the normalized rows into the output.
//   With `partial` (key-split decode): writes per head the running max
//   (m[r]), the sum of exponentials (l[r]) and the unnormalized sum acc[r*D..].
struct Partial {
  float* m;
  float* l;
  float* acc;
};

constexpr int64_t kKeyBlock = 64;  // value rows per L1-resident block

void attend_group(const AttnArgs& a, int64_t b, int64_t i, int64_t g, int64_t j0,
                  int64_t j1, float* p, const Partial* partial) {
  const int64_t G = a.H / a.Hkv;
  const int64_t D = a.D;
  int64_t n_end = a.n_kv;
  if (a.causal) n_end = std::min(n_end, a.start_pos + i + 1);
  j1 = std::min(j1, n_end);
  const int64_t n = std::max<int64_t>(0, j1 - j0);
  const int64_t ks = a.k_ss, vs = a.v_ss;
  const float* k = a.k + b * a.k_sb + g * a.k_sh + j0 * ks;
  const float* v = a.v + b * a.v_sb + g * a.v_sh + j0 * vs;
  const float* qrow = a.q + b * a.q_sb + i * a.q_ss;
  float* orow = a.o + b * a.o_sb + i * a.o_ss;

  // Scaled queries of the group, contiguous: the scores come out scaled.
  float qbuf[1024];
  std::vector<float> qbig;
  float* qs = qbuf;
  if (G * D > 1024) {
    qbig.resize(G * D);
    qs = qbig.data();
  }
  for (int64_t r = 0; r < G; ++r) {
    const float* qr = qrow + (g * G + r) * a.q_sh;
    for (int64_t d = 0; d < D; ++d) qs[r * D + d] = qr[d] * a.scale;
  }
  // Pass 1: scores, 8 keys at a time for all heads of the group.
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int64_t r = 0; r < G; ++r) dot8(qs + r * D, k + j * ks, ks, D, p + r * n + j);
  }
  for (; j < n; ++j) {
    for (int64_t r = 0; r < G; ++r) p[r * n + j] = dot1(qs + r * D, k + j * ks, D);
  }
  // Mask, max; pass 2: exponentials.
  float inv_l[64];
  float* linv = G <= 64 ? inv_l : nullptr;
  std::vector<float> inv_big;
  if (!linv) {
    inv_big.resize(G);
    linv = inv_big.data();
  }
  const float* mrow = a.mask ? a.mask + i * a.mask_ss + j0 : nullptr;
  for (int64_t r = 0; r < G; ++r) {
    float* pr = p + r * n;
    const float mx = add_max(pr, mrow, n);
    float l = 0.f;
    if (mx > -INFINITY) {
      l = exp_shift_sum(pr, n, mx);
    } else {
      std::fill(pr, pr + n, 0.f);  // nothing visible (or all masked)
    }
    float* dst = partial ? partial->acc + r * D : orow + (g * G + r) * a.o_sh;
    std::fill(dst, dst + D, 0.f);
    if (partial) {
      partial->m[r] = mx;
      partial->l[r] = l;
    } else {
      linv[r] = l > 0.f ? 1.f / l : 0.f;
    }
  }
  // Pass 3: weighted sums of value rows, a block of rows at a time for all heads.
  for (int64_t jb = 0; jb < n; jb += kKeyBlock) {
    const int64_t len = std::min(kKeyBlock, n - jb);
    for (int64_t r = 0; r < G; ++r) {
      float* dst = partial ? partial->acc + r * D : orow + (g * G + r) * a.o_sh;
      weighted_acc(p + r * n + jb, len, v + jb * vs, vs, D, dst);
    }
  }
  if (!partial) {
    for (int64_t r = 0; r < G; ++r) {
      float* dst = orow + (g * G + r) * a.o_sh;
      const float s = linv[r];
      for (int64_t d = 0; d < D; ++d) dst[d] *= s;
    }
  }
}

int64_t thread_count() {
#ifdef ET_USE_THREADPOOL
  return std::max<int64_t>(1, executorch::extension::get_thread_count());
#else
  return 1;
#endif
}

void run_attention(const AttnArgs& a) {
  const int64_t G = a.H / a.Hkv;
  const int64_t groups = a.B * a.S * a.Hkv;  // units of (batch, row, kv head)
  if (groups <= 0) return;
  const int64_t threads = thread_count();
  const int64_t work = a.B * a.S * a.H * a.n_kv * a.D;
  if (threads <= 1 || work < (1 << 17)) {  // below ~20 us: not worth waking threads
    std::vector<float> p(static_cast<size_t>(G * a.n_kv) + 8);
    for (int64_t u = 0; u < groups; ++u) {
      const int64_t g = u % a.Hkv, bi = u / a.Hkv;
      attend_group(a, bi / a.S, bi % a.S, g, 0, a.n_kv, p.data(), nullptr);
    }
    return;
  }
  // Few groups (decode): split the keys too, then merge the partial softmaxes.
  int64_t splits = 1;
  if (groups < 2 * threads) {
    splits = (2 * threads + groups - 1) / groups;
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, a.n_kv / 128));
  }
  if (splits <= 1) {
    const int64_t grain = std::max<int64_t>(1, groups / (threads * 4));
    executorch::extension::parallel_for(0, groups, grain, [&](int64_t u0, int64_t u1) {
      std::vector<float> p(static_cast<size_t>(G * a.n_kv) + 8);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t g = u % a.Hkv, bi = u / a.Hkv;
        attend_group(a, bi / a.S, bi % a.S, g, 0, a.n_kv, p.data(), nullptr);
      }
    });
    return;
  }
  const int64_t chunk = (a.n_kv + splits - 1) / splits;
  const int64_t units = groups * splits;
  // Per unit: G maxima, G sums, G * D accumulators.
  const int64_t per = G * (a.D + 2);
  std::vector<float> part(static_cast<size_t>(units * per));
  executorch::extension::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> p(static_cast<size_t>(G * chunk) + 8);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t c = u % splits, grp = u / splits;
      const int64_t g = grp % a.Hkv, bi = grp / a.Hkv;
      float* base = part.data() + u * per;
      Partial pt{base, base + G, base + 2 * G};
      attend_group(a, bi / a.S, bi % a.S, g, c * chunk, (c + 1) * chunk, p.data(), &pt);
    }
  });
  for (int64_t grp = 0; grp < groups; ++grp) {
    const int64_t g = grp % a.Hkv, bi = grp / a.Hkv;
    const int64_t b = bi / a.S, i = bi % a.S;
    for (int64_t r = 0; r < G; ++r) {
      float M = -INFINITY;
      for (int64_t c = 0; c < splits; ++c)
        M = std::max(M, part[(grp * splits + c) * per + r]);
      float* dst = a.o + b * a.o_sb + i * a.o_ss + (g * G + r) * a.o_sh;
      std::fill(dst, dst + a.D, 0.f);
      if (!(M > -INFINITY)) continue;
      float L = 0.f;
      for (int64_t c = 0; c < splits; ++c) {
        const float* base = part.data() + (grp * splits + c) * per;
        if (!(base[r] > -INFINITY)) continue;
        const float w = std::exp(base[r] - M);
        L += w * base[G + r];
        const float* acc = base + 2 * G + r * a.D;
        for (int64_t d = 0; d < a.D; ++d) dst[d] += w * acc[d];
      }
      const float s = 1.f / L;
      for (int64_t d = 0; d < a.D; ++d) dst[d] *= s;
    }
  }
}

// ---------------------------------------------------------------------------
// Kernels (unboxed), shared by the registry wrappers and the test entry points.

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "Float";
    case ScalarType::Half: return "Half";
    case ScalarType::BFloat16: return "BFloat16";
    case ScalarType::Double: return "Double";
    default: return "non-float";
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
  ET_KERNEL_CHECK_MSG(ctx, start_pos >= 0 && start_pos + S <= Smax, InvalidArgument,
                      false, "%s: rows %lld..%lld outside the cache of %lld rows", op,
                      (long long)start_pos, (long long)(start_pos + S), (long long)Smax);
  ET_KERNEL_CHECK_MSG(ctx, innermost_contiguous(value) && innermost_contiguous(cache),
                      InvalidArgument, false, "%s: innermost dim must be contiguous", op);
  const int64_t B = value.size(0), H = value.size(2), D = value.size(3);
  const size_t es = value.element_size();
  const char* src = static_cast<const char*>(value.const_data_ptr());
  char* dst = static_cast<char*>(cache.mutable_data_ptr());
  const auto vs = value.strides();
  const auto cs = cache.strides();
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

Tensor& update_cache_out(KernelRuntimeContext& ctx, const Tensor& value,
                         const Tensor& cache, int64_t start_pos, Tensor& out) {
  etserve::kv_observe(cache, "llama::update_cache");
  copy_into_cache(ctx, "llama::update_cache", value, cache, start_pos);
  return out;  // the op's output is a placeholder; nothing reads it
}

Tensor& update_cache_with_indices_out(KernelRuntimeContext& ctx, const Tensor& value,
                                      const Tensor& cache, int64_t start_pos,
                                      const Tensor& indices, Tensor& out) {
  (void)start_pos;
  const char* op = "llama::update_cache_with_indices";
  etserve::kv_observe_indexed(op);
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

// Validates and runs attention of q over the caches with `n_kv_nomask` keys
// visible when there is no mask (all cache rows with one).
void attention_checked(KernelRuntimeContext& ctx, const char* op, const Tensor& q,
                       const Tensor& kc, const Tensor& vc, int64_t start_pos,
                       int64_t n_kv_nomask, const std::optional<Tensor>& mask,
                       bool is_causal, const std::optional<double>& scale, Tensor& out) {
  ET_KERNEL_CHECK_MSG(ctx, q.dim() == 4 && kc.dim() == 4 && vc.dim() == 4, InvalidArgument, ,
                      "%s: query and caches must be 4-D", op);
  for (const Tensor* t : {&q, &kc, &vc, static_cast<const Tensor*>(&out)}) {
    ET_KERNEL_CHECK_MSG(ctx, t->scalar_type() == ScalarType::Float, InvalidArgument, ,
                        "%s: only float32 is supported by etserve's kernels, got %s "
                        "(export the model in fp32)",
                        op, dtype_name(t->scalar_type()));
  }
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

  AttnArgs a;
  const auto qs = q.strides(), ks = kc.strides(), vs = vc.strides(), os = out.strides();
  a.q = q.const_data_ptr<float>();
  a.q_sb = qs[0], a.q_ss = qs[1], a.q_sh = qs[2];
  a.k = kc.const_data_ptr<float>();
  a.k_sb = ks[0], a.k_ss = ks[1], a.k_sh = ks[2];
  a.v = vc.const_data_ptr<float>();
  a.v_sb = vs[0], a.v_ss = vs[1], a.v_sh = vs[2];
  a.o = out.mutable_data_ptr<float>();
  a.o_sb = os[0], a.o_ss = os[1], a.o_sh = os[2];
  a.B = B, a.S = S, a.H = H, a.Hkv = Hkv, a.D = D;
  a.n_kv = n_kv;
  a.start_pos = start_pos;
  a.causal = is_causal;
  a.mask = mp;
  a.mask_ss = mask_ss;
  a.scale = scale.has_value() ? static_cast<float>(*scale)
                              : 1.0f / std::sqrt(static_cast<float>(D));
  run_attention(a);
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
  etserve::kv_observe(k_cache, op);
  etserve::kv_observe(v_cache, op);
  if (!copy_into_cache(ctx, op, k, k_cache, start_pos)) return out;
  if (!copy_into_cache(ctx, op, v, v_cache, start_pos)) return out;
  attention_checked(ctx, op, q, k_cache, v_cache, start_pos, start_pos + seq_len, mask,
                    is_causal, scale, out);
  return out;
}

// ---------------------------------------------------------------------------
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

const Kernel kKernels[] = {
    Kernel("llama::update_cache.out", boxed_update_cache),
    Kernel("llama::update_cache_with_indices.out", boxed_update_cache_with_indices),
    Kernel("llama::custom_sdpa.out", boxed_custom_sdpa),
    Kernel("llama::sdpa_with_kv_cache.out", boxed_sdpa_with_kv_cache),
};
constexpr int kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

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

// ---------------------------------------------------------------------------
// Test helpers: contiguous tensors over caller buffers.

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

}  // namespace

extern "C" {

int etserve_llm_op_count(void) { return kNumKernels; }

const char* etserve_llm_op_name(int i) {
  return (i >= 0 && i < kNumKernels) ? kKernels[i].name_ : nullptr;
}

int etserve_llm_ops_registered(void) { return g_registered ? 1 : 0; }

int etserve_test_custom_sdpa(const float* q, int B, int S, int H, int D,
                             const float* k_cache, const float* v_cache, int S_max,
                             int H_kv, int64_t start_pos, int is_causal,
                             const float* mask, float scale, float* out) {
  TensorBuf tq(ScalarType::Float, {B, S, H, D}, q);
  TensorBuf tk(ScalarType::Float, {B, S_max, H_kv, D}, k_cache);
  TensorBuf tv(ScalarType::Float, {B, S_max, H_kv, D}, v_cache);
  TensorBuf to(ScalarType::Float, {B, S, H, D}, out);
  std::optional<TensorBuf> tm;
  std::optional<Tensor> m;
  if (mask) {
    tm.emplace(ScalarType::Float, std::initializer_list<int64_t>{S, S_max}, mask);
    m = tm->tensor();
  }
  std::optional<double> sc;
  if (scale > 0) sc = scale;
  KernelRuntimeContext ctx;
  Tensor o = to.tensor();
  custom_sdpa_out(ctx, tq.tensor(), tk.tensor(), tv.tensor(), start_pos, m, 0.0,
                  is_causal != 0, sc, o);
  return static_cast<int>(ctx.failure_state());
}

int etserve_test_update_cache(const float* value, int B, int S, int H_kv, int D,
                              float* cache, int S_max, int64_t start_pos) {
  TensorBuf tv(ScalarType::Float, {B, S, H_kv, D}, value);
  TensorBuf tc(ScalarType::Float, {B, S_max, H_kv, D}, cache);
  float dummy = 0;
  TensorBuf to(ScalarType::Float, {1}, &dummy);
  KernelRuntimeContext ctx;
  Tensor o = to.tensor();
  update_cache_out(ctx, tv.tensor(), tc.tensor(), start_pos, o);
  return static_cast<int>(ctx.failure_state());
}

int etserve_test_sdpa_with_kv_cache(const float* q, const float* k, const float* v,
                                    int B, int S, int H, int D, float* k_cache,
                                    float* v_cache, int S_max, int H_kv,
                                    int64_t start_pos, int is_causal, const float* mask,
                                    float scale, float* out) {
  TensorBuf tq(ScalarType::Float, {B, S, H, D}, q);
  TensorBuf tk(ScalarType::Float, {B, S, H_kv, D}, k);
  TensorBuf tv(ScalarType::Float, {B, S, H_kv, D}, v);
  TensorBuf tkc(ScalarType::Float, {B, S_max, H_kv, D}, k_cache);
  TensorBuf tvc(ScalarType::Float, {B, S_max, H_kv, D}, v_cache);
  TensorBuf to(ScalarType::Float, {B, S, H, D}, out);
  std::optional<TensorBuf> tm;
  std::optional<Tensor> m;
  if (mask) {
    tm.emplace(ScalarType::Float, std::initializer_list<int64_t>{S, S_max}, mask);
    m = tm->tensor();
  }
  std::optional<double> sc;
  if (scale > 0) sc = scale;
  KernelRuntimeContext ctx;
  Tensor o = to.tensor();
  sdpa_with_kv_cache_out(ctx, tq.tensor(), tk.tensor(), tv.tensor(), tkc.tensor(),
                         tvc.tensor(), start_pos, S, m, 0.0, is_causal != 0, sc, o);
  return static_cast<int>(ctx.failure_state());
}

int etserve_test_custom_sdpa_dtype(int dtype) {
  const ScalarType t = static_cast<ScalarType>(dtype);
  alignas(64) static thread_local float scratch[4][64];
  std::memset(scratch, 0, sizeof(scratch));
  TensorBuf tq(t, {1, 1, 2, 8}, scratch[0]);
  TensorBuf tk(t, {1, 2, 1, 8}, scratch[1]);
  TensorBuf tv(t, {1, 2, 1, 8}, scratch[2]);
  TensorBuf to(t, {1, 1, 2, 8}, scratch[3]);
  KernelRuntimeContext ctx;
  Tensor o = to.tensor();
  custom_sdpa_out(ctx, tq.tensor(), tk.tensor(), tv.tensor(), 0, std::nullopt, 0.0, true,
                  std::nullopt, o);
  return static_cast<int>(ctx.failure_state());
}

}  // extern "C"
