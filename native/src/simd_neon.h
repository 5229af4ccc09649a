// Advanced SIMD (aarch64) versions of simd.h's vector helpers, for the NEON kernel sets: what the
// generic attention tile (attention.cpp: prefill rows and every kernel set without a decode kernel
// of its own), the NEON decode kernel (attention_decode_neon.cpp) and the sampler's reductions run
// on ARM. Included by simd.h after its exp constants, where isa.h's ETS_NEON holds; simd.h's
// functions hand over to these. Each does the AVX2 version's arithmetic in 128-bit vectors (the
// multiply-adds fused where the AVX2 one fuses them), so the kernel checks' float64 bounds hold for
// both; the exact int16 dot products are exact here too.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace etserve::simd::neon {

// e^x for x <= 0 (or -inf: ~1e-38), as simd.h's exp256: x = n ln2 + r, a degree-6 polynomial
// for e^r, 2^n through the exponent bits.
inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(kExpMin)), vdupq_n_f32(kExpMax));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(kLog2e)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(kLn2Hi));
  r = vfmsq_f32(r, n, vdupq_n_f32(kLn2Lo));
  float32x4_t p = vdupq_n_f32(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = vfmaq_f32(vdupq_n_f32(kExpPoly[i]), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

// Lane r of the result: the total of a[r] (r < 4).
inline float32x4_t hsum4x4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
  return vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3));
}
inline int32x4_t hsum4x4(int32x4_t a0, int32x4_t a1, int32x4_t a2, int32x4_t a3) {
  return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
}

// acc plus the 16 products of a and b (int8), summed into acc's four lanes (in an order of their
// own: only the lanes' total means anything): SDOT on the dotprod tier, widening multiplies and
// pairwise adds otherwise. Exact either way (a product's magnitude is at most 2^14).
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(ETS_NEON_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
}

inline void store4(float* p, float32x4_t v) { vst1q_f32(p, v); }
inline void store4(int32_t* p, int32x4_t v) { vst1q_s32(p, v); }

// res[r] = sum_d q[d] k[r ks + d] for 8 rows: Step elements at a time into one accumulator per
// row (mac), their totals by pairwise adds, the rest one by one.
template <int Step, typename V, typename T, typename R, typename Mac>
inline void dot8_rows(const T* q, const T* k, int64_t ks, int64_t n, R* res, V zero, Mac mac) {
  V a[8];
  for (int r = 0; r < 8; ++r) a[r] = zero;
  int64_t d = 0;
  for (; d + Step <= n; d += Step)
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = mac(a[r], q + d, k + r * ks + d);
  store4(res, hsum4x4(a[0], a[1], a[2], a[3]));
  store4(res + 4, hsum4x4(a[4], a[5], a[6], a[7]));
  for (; d < n; ++d)
    for (int r = 0; r < 8; ++r) res[r] += q[d] * k[r * ks + d];
}

inline void dot8(const float* q, const float* k, int64_t ks, int64_t D, float* res) {
  dot8_rows<4>(q, k, ks, D, res, vdupq_n_f32(0.f),
               [](float32x4_t a, const float* x, const float* y) { return vfmaq_f32(a, vld1q_f32(x), vld1q_f32(y)); });
}

inline float dot1(const float* q, const float* k, int64_t D) {
  float32x4_t a0 = vdupq_n_f32(0.f), a1 = a0;
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    a0 = vfmaq_f32(a0, vld1q_f32(q + d), vld1q_f32(k + d));
    a1 = vfmaq_f32(a1, vld1q_f32(q + d + 4), vld1q_f32(k + d + 4));
  }
  for (; d + 4 <= D; d += 4) a0 = vfmaq_f32(a0, vld1q_f32(q + d), vld1q_f32(k + d));
  float s = vaddvq_f32(vaddq_f32(a0, a1));
  for (; d < D; ++d) s += q[d] * k[d];
  return s;
}

inline float add_max(float* p, const float* m, int64_t n) {
  float32x4_t vm = vdupq_n_f32(-INFINITY);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    float32x4_t x = vld1q_f32(p + j);
    if (m) {
      x = vaddq_f32(x, vld1q_f32(m + j));
      vst1q_f32(p + j, x);
    }
    vm = vmaxq_f32(vm, x);
  }
  float mx = vmaxvq_f32(vm);
  for (; j < n; ++j) {
    if (m) p[j] += m[j];
    mx = std::max(mx, p[j]);
  }
  return mx;
}

inline float exp_shift_sum(float* p, int64_t n, float mx) {
  const float32x4_t m = vdupq_n_f32(mx);
  float32x4_t acc = vdupq_n_f32(0.f);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(p + j), m));
    vst1q_f32(p + j, e);
    acc = vaddq_f32(acc, e);
  }
  float sum = vaddvq_f32(acc);
  for (; j < n; ++j) {
    const float e = std::exp(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  return sum;
}

// o[d0, d0 + 4 NV) of one or two outputs (O) += the weights times the value rows: every
// accumulator in registers over all n rows (NV = 16: 64 dims of one output, 8: 32 of two).
template <int NV, int O>
inline void weighted_chunk(const float* const* p, int64_t n, const float* v, int64_t vs, float* const* o) {
  float32x4_t a[O][NV];
  for (int x = 0; x < O; ++x)
    for (int c = 0; c < NV; ++c) a[x][c] = vld1q_f32(o[x] + 4 * c);
  for (int64_t j = 0; j < n; ++j, v += vs) {
    float32x4_t w[O];
    for (int x = 0; x < O; ++x) w[x] = vdupq_n_f32(p[x][j]);
#pragma GCC unroll 16
    for (int c = 0; c < NV; ++c) {
      const float32x4_t vc = vld1q_f32(v + 4 * c);
      for (int x = 0; x < O; ++x) a[x][c] = vfmaq_f32(a[x][c], w[x], vc);
    }
  }
  for (int x = 0; x < O; ++x)
    for (int c = 0; c < NV; ++c) vst1q_f32(o[x] + 4 * c, a[x][c]);
}

// o[d] += sum_j p[j] v[j vs + d] for O outputs (their weights p[x], sums o[x]) over one set of
// value rows, each row read once for all of them.
template <int O>
inline void weighted_sums(const float* const* p, int64_t n, const float* v, int64_t vs, int64_t D,
                          float* const* o) {
  constexpr int kWide = 16 / O;  // vectors per output in a chunk: 16 accumulators in all
  int64_t d = 0;
  float* od[O];
  for (; d + 4 * kWide <= D; d += 4 * kWide) {
    for (int x = 0; x < O; ++x) od[x] = o[x] + d;
    weighted_chunk<kWide, O>(p, n, v + d, vs, od);
  }
  for (; d + 4 <= D; d += 4) {
    for (int x = 0; x < O; ++x) od[x] = o[x] + d;
    weighted_chunk<1, O>(p, n, v + d, vs, od);
  }
  for (; d < D; ++d)
    for (int x = 0; x < O; ++x)
      for (int64_t j = 0; j < n; ++j) o[x][d] += p[x][j] * v[j * vs + d];
}

inline void weighted_acc(const float* p, int64_t n, const float* v, int64_t vs, int64_t D, float* o) {
  weighted_sums<1>(&p, n, v, vs, D, &o);
}

inline void weighted_acc2(const float* p0, const float* p1, int64_t n, const float* v, int64_t vs,
                          int64_t D, float* o0, float* o1) {
  const float* p[2] = {p0, p1};
  float* o[2] = {o0, o1};
  weighted_sums<2>(p, n, v, vs, D, o);
}

// 8 int8 -> two vectors of 4 int32.
inline void widen8(const int8_t* x, int32x4_t& lo, int32x4_t& hi) {
  const int16x8_t w = vmovl_s8(vld1_s8(x));
  lo = vmovl_s16(vget_low_s16(w));
  hi = vmovl_high_s16(w);
}

inline void dequant_row(const int8_t* x, int64_t n, float scale, int32_t zero_point, float* dst) {
  const float32x4_t vs = vdupq_n_f32(scale), vz = vdupq_n_f32(static_cast<float>(zero_point));
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    int32x4_t lo, hi;
    widen8(x + d, lo, hi);
    vst1q_f32(dst + d, vmulq_f32(vsubq_f32(vcvtq_f32_s32(lo), vz), vs));
    vst1q_f32(dst + d + 4, vmulq_f32(vsubq_f32(vcvtq_f32_s32(hi), vz), vs));
  }
  for (; d < n; ++d) dst[d] = (static_cast<float>(x[d]) - static_cast<float>(zero_point)) * scale;
}

inline void int8_to_float(const int8_t* x, int64_t n, int32_t zero_point, float* dst) {
  const int32x4_t z = vdupq_n_s32(zero_point);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    int32x4_t lo, hi;
    widen8(x + d, lo, hi);
    vst1q_f32(dst + d, vcvtq_f32_s32(vsubq_s32(lo, z)));
    vst1q_f32(dst + d + 4, vcvtq_f32_s32(vsubq_s32(hi, z)));
  }
  for (; d < n; ++d) dst[d] = static_cast<float>(x[d] - zero_point);
}

inline void int8_to_int16(const int8_t* x, int64_t n, int32_t zero_point, int16_t* dst) {
  const int16x8_t z = vdupq_n_s16(static_cast<int16_t>(zero_point));
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) vst1q_s16(dst + d, vsubq_s16(vmovl_s8(vld1_s8(x + d)), z));
  for (; d < n; ++d) dst[d] = static_cast<int16_t>(x[d] - zero_point);
}

// Exact: int16 products widened into int32 lanes (vmlal).
inline void dot8_i16(const int16_t* q, const int16_t* k, int64_t ks, int64_t n, int32_t* res) {
  dot8_rows<8>(q, k, ks, n, res, vdupq_n_s32(0), [](int32x4_t a, const int16_t* x, const int16_t* y) {
    const int16x8_t xv = vld1q_s16(x), yv = vld1q_s16(y);
    return vmlal_high_s16(vmlal_s16(a, vget_low_s16(xv), vget_low_s16(yv)), xv, yv);
  });
}

inline int32_t dot1_i16(const int16_t* q, const int16_t* k, int64_t n) {
  int32x4_t a = vdupq_n_s32(0);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    const int16x8_t qv = vld1q_s16(q + d), kv = vld1q_s16(k + d);
    a = vmlal_high_s16(vmlal_s16(a, vget_low_s16(qv), vget_low_s16(kv)), qv, kv);
  }
  int32_t s = vaddvq_s32(a);
  for (; d < n; ++d) s += q[d] * k[d];
  return s;
}

inline void scale_ints(const int32_t* x, const float* scale, float c, int64_t n, float* s) {
  const float32x4_t vc = vdupq_n_f32(c);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    vst1q_f32(s + j, vmulq_f32(vmulq_f32(vcvtq_f32_s32(vld1q_s32(x + j)), vld1q_f32(scale + j)), vc));
  for (; j < n; ++j) s[j] = static_cast<float>(x[j]) * scale[j] * c;
}

inline void mul_elems(const float* a, const float* b, int64_t n, float* out) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) vst1q_f32(out + j, vmulq_f32(vld1q_f32(a + j), vld1q_f32(b + j)));
  for (; j < n; ++j) out[j] = a[j] * b[j];
}

inline void scale_row(float* x, int64_t n, float s) {
  const float32x4_t vs = vdupq_n_f32(s);
  int64_t d = 0;
  for (; d + 4 <= n; d += 4) vst1q_f32(x + d, vmulq_f32(vld1q_f32(x + d), vs));
  for (; d < n; ++d) x[d] *= s;
}

// The sampler's sums over a vocabulary, in double lanes as the AVX2 ones.
inline void add_to_pd(float32x4_t v, float64x2_t& lo, float64x2_t& hi) {
  lo = vaddq_f64(lo, vcvt_f64_f32(vget_low_f32(v)));
  hi = vaddq_f64(hi, vcvt_high_f64_f32(v));
}

inline double sum_exp_shift(const float* x, int64_t n, float mx) {
  const float32x4_t m = vdupq_n_f32(mx);
  float64x2_t lo = vdupq_n_f64(0.0), hi = lo;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) add_to_pd(exp4(vsubq_f32(vld1q_f32(x + j), m)), lo, hi);
  double sum = vaddvq_f64(vaddq_f64(lo, hi));
  for (; j < n; ++j) sum += std::exp(static_cast<double>(x[j] - mx));
  return sum;
}

inline double exp_weights(const float* x, float* w, int64_t n, float mx, float s) {
  const float32x4_t m = vdupq_n_f32(mx), vs = vdupq_n_f32(s), floor = vdupq_n_f32(-87.0f);
  float64x2_t lo = vdupq_n_f64(0.0), hi = lo;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float32x4_t a = vmulq_f32(vsubq_f32(vld1q_f32(x + j), m), vs);
    const float32x4_t e =
        vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(exp4(a)), vcgeq_f32(a, floor)));
    vst1q_f32(w + j, e);
    add_to_pd(e, lo, hi);
  }
  double sum = vaddvq_f64(vaddq_f64(lo, hi));
  for (; j < n; ++j) {
    const float a = (x[j] - mx) * s;
    w[j] = a >= -87.0f ? std::exp(a) : 0.0f;
    sum += w[j];
  }
  return sum;
}

}  // namespace etserve::simd::neon
