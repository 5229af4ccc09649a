// Vector helpers over contiguous floats for etserve's attention kernels
// (attention.cpp): dot products, masked max, exp-and-sum, weighted sums of
// value rows; and the sampler's exp sums over a vocabulary (sampler.cpp).
// AVX2+FMA when the compiler targets it, Advanced SIMD in the aarch64 NEON kernel sets
// (simd_neon.h), scalar otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "isa.h"  // ETS_NEON

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ETS_AVX2 1
#if defined(__AVX512F__)
#define ETS_AVX512 1
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define ETS_VNNI512 1
#endif
#endif
#elif defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace etserve::simd {

// The exp of the softmaxes (exp256, and exp512 with AVX-512):
// inputs clamped to [kExpMin, kExpMax]; x = n ln2 + r with ln2 in two parts;
// e^r = 1 + r + r^2 (((((c0 r + c1) r + c2) r + c3) r + c4) r + c5).
constexpr float kExpMin = -87.0f, kExpMax = 88.0f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
// The decode kernels' 2^f, |f| <= 1/2 (exp2_512, exp2_256): a degree-5 polynomial fitted for
// relative error, highest power first; and their log2(m), m in [0.75, 1.5) (log2_512,
// log2_256): 2 atanh(z) / ln 2, z = (m - 1) / (m + 1), by its series to z^7.
constexpr float kExp2Poly[6] = {1.327647129073739e-3f, 9.675541892647743e-3f, 5.550713092088699e-2f,
                                0.24022120237350464f, 0.6931469440460205f, 1.0000001192092896f};
constexpr float kAtanhSeries[4] = {1.f / 7.f, 1.f / 5.f, 1.f / 3.f, 1.f};

}  // namespace etserve::simd

#if defined(ETS_NEON)
#include "simd_neon.h"
// Each helper below hands over to its NEON version first.
#define ETS_NEON_IMPL(call) return neon::call
#else
#define ETS_NEON_IMPL(call)
#endif

namespace etserve::simd {

#if defined(__AVX512F__)  // even without ETS_AVX2: attention_amx.cpp adds AVX-512 to any -march
// e^x, x <= 0 or -inf (-> ~1e-38): exp256 on 16 lanes, 2^n by vscalefps.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// 2^x for x <= 16 (or -inf: 2^-126), to about 2.3e-7 relative: the softmax weights of the
// decode kernel, which keep 16 bits of them. x = n + f, |f| <= 1/2, 2^f by a degree-5
// polynomial fitted for relative error, 2^n by vscalefps.
inline __m512 exp2_512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));  // 2^-126: the smallest normal float
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  return _mm512_scalef_ps(p, n);
}

// log2(x) for normal x > 0, to about 1e-7: x = m 2^e with m in [0.75, 1.5), log2(m) =
// 2 atanh(z) / ln 2 with z = (m - 1) / (m + 1), |z| <= 0.2, by its series to z^7.
inline __m512 log2_512(__m512 x) {
  const __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_src);
  const __m512 e = _mm512_getexp_ps(_mm512_mul_ps(x, _mm512_set1_ps(4.f / 3.f)));  // m's exponent
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 z = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
  const __m512 z2 = _mm512_mul_ps(z, z);
  __m512 p = _mm512_set1_ps(kAtanhSeries[0]);
  for (int i = 1; i < 4; ++i) p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(kAtanhSeries[i]));
  return _mm512_fmadd_ps(_mm512_mul_ps(p, z), _mm512_set1_ps(2.f * kLog2e), e);
}
#endif

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
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// exp2_512 on 8 lanes (2^x for x <= 16, or -inf: 2^-126), 2^n through the exponent bits.
inline __m256 exp2_256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// log2_512 on 8 lanes (normal x > 0): the exponent e of x 4/3 from its bits, m = x 2^-e in
// [0.75, 1.5).
inline __m256 log2_256(__m256 x) {
  const __m256i xe = _mm256_castps_si256(_mm256_mul_ps(x, _mm256_set1_ps(4.f / 3.f)));
  const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(xe, 23), _mm256_set1_epi32(127));  // x > 0: no sign bit
  const __m256 m = _mm256_mul_ps(x, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127), e), 23)));
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 z = _mm256_div_ps(_mm256_sub_ps(m, one), _mm256_add_ps(m, one));
  const __m256 z2 = _mm256_mul_ps(z, z);
  __m256 p = _mm256_set1_ps(kAtanhSeries[0]);
  for (int i = 1; i < 4; ++i) p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(kAtanhSeries[i]));
  return _mm256_fmadd_ps(_mm256_mul_ps(p, z), _mm256_set1_ps(2.f * kLog2e), _mm256_cvtepi32_ps(e));
}
#endif

#ifdef ETS_AVX512
// The two 256-bit halves of v added: 16 lanes -> 8 with the same total.
inline __m256 half_sum(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
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
  ETS_NEON_IMPL(dot8(q, k, ks, D, res));
  int64_t d = 0;
#ifdef ETS_AVX512
  if (D % 16 == 0) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    __m512 a4 = _mm512_setzero_ps(), a5 = _mm512_setzero_ps();
    __m512 a6 = _mm512_setzero_ps(), a7 = _mm512_setzero_ps();
    for (; d < D; d += 16) {
      const __m512 qv = _mm512_loadu_ps(q + d);
      const float* kd = k + d;
      a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + ks), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + 2 * ks), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + 3 * ks), a3);
      a4 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + 4 * ks), a4);
      a5 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + 5 * ks), a5);
      a6 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + 6 * ks), a6);
      a7 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kd + 7 * ks), a7);
    }
    _mm256_storeu_ps(res, hsum8x8(half_sum(a0), half_sum(a1), half_sum(a2), half_sum(a3),
                                  half_sum(a4), half_sum(a5), half_sum(a6), half_sum(a7)));
    return;
  }
#endif
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
  ETS_NEON_IMPL(dot1(q, k, D));
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
  ETS_NEON_IMPL(add_max(p, m, n));
  int64_t j = 0;
  float mx = -INFINITY;
#ifdef ETS_AVX512
  const __m512 lowest = _mm512_set1_ps(-INFINITY);
  __m512 vm = lowest;
  for (; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512 x = _mm512_mask_loadu_ps(lowest, k, p + j);
    if (m) {
      x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, m + j));
      _mm512_mask_storeu_ps(p + j, k, x);
    }
    vm = _mm512_max_ps(vm, x);
  }
  mx = _mm512_reduce_max_ps(vm);
#elif defined(ETS_AVX2)
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
  ETS_NEON_IMPL(exp_shift_sum(p, n, mx));
  int64_t j = 0;
  float sum = 0;
#ifdef ETS_AVX512
  const __m512 m = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + j), m)));
    _mm512_mask_storeu_ps(p + j, k, e);
    acc = _mm512_add_ps(acc, e);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(ETS_AVX2)
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
  ETS_NEON_IMPL(weighted_acc(p, n, v, vs, D, o));
  int64_t d = 0;
#ifdef ETS_AVX512
  // Even and odd rows into two sets of accumulators: eight independent FMA chains, not
  // four (one chain per 16 dims would wait on the FMA latency every row).
  for (; d + 64 <= D; d += 64) {
    __m512 a0 = _mm512_loadu_ps(o + d), a1 = _mm512_loadu_ps(o + d + 16);
    __m512 a2 = _mm512_loadu_ps(o + d + 32), a3 = _mm512_loadu_ps(o + d + 48);
    __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
    const float* vp = v + d;
    int64_t j = 0;
    for (; j + 2 <= n; j += 2, vp += 2 * vs) {
      const __m512 pj = _mm512_set1_ps(p[j]), pk = _mm512_set1_ps(p[j + 1]);
      a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp), a0);
      a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp + 16), a1);
      a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp + 32), a2);
      a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp + 48), a3);
      b0 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vp + vs), b0);
      b1 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vp + vs + 16), b1);
      b2 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vp + vs + 32), b2);
      b3 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vp + vs + 48), b3);
    }
    if (j < n) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp), a0);
      a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp + 16), a1);
      a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp + 32), a2);
      a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp + 48), a3);
    }
    _mm512_storeu_ps(o + d, _mm512_add_ps(a0, b0));
    _mm512_storeu_ps(o + d + 16, _mm512_add_ps(a1, b1));
    _mm512_storeu_ps(o + d + 32, _mm512_add_ps(a2, b2));
    _mm512_storeu_ps(o + d + 48, _mm512_add_ps(a3, b3));
  }
#endif
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

// weighted_acc for two weight rows over the same value rows: o0 += sum_j p0[j] v(j),
// o1 += sum_j p1[j] v(j), each value row loaded once for both.
inline void weighted_acc2(const float* p0, const float* p1, int64_t n, const float* v, int64_t vs,
                          int64_t D, float* o0, float* o1) {
  ETS_NEON_IMPL(weighted_acc2(p0, p1, n, v, vs, D, o0, o1));
#ifdef ETS_AVX512
  if (D % 64 == 0) {
    for (int64_t d = 0; d < D; d += 64) {
      __m512 a0 = _mm512_loadu_ps(o0 + d), a1 = _mm512_loadu_ps(o0 + d + 16);
      __m512 a2 = _mm512_loadu_ps(o0 + d + 32), a3 = _mm512_loadu_ps(o0 + d + 48);
      __m512 b0 = _mm512_loadu_ps(o1 + d), b1 = _mm512_loadu_ps(o1 + d + 16);
      __m512 b2 = _mm512_loadu_ps(o1 + d + 32), b3 = _mm512_loadu_ps(o1 + d + 48);
      const float* vp = v + d;
      for (int64_t j = 0; j < n; ++j, vp += vs) {
        const __m512 x = _mm512_set1_ps(p0[j]), y = _mm512_set1_ps(p1[j]);
        const __m512 v0 = _mm512_loadu_ps(vp), v1 = _mm512_loadu_ps(vp + 16);
        const __m512 v2 = _mm512_loadu_ps(vp + 32), v3 = _mm512_loadu_ps(vp + 48);
        a0 = _mm512_fmadd_ps(x, v0, a0);
        a1 = _mm512_fmadd_ps(x, v1, a1);
        a2 = _mm512_fmadd_ps(x, v2, a2);
        a3 = _mm512_fmadd_ps(x, v3, a3);
        b0 = _mm512_fmadd_ps(y, v0, b0);
        b1 = _mm512_fmadd_ps(y, v1, b1);
        b2 = _mm512_fmadd_ps(y, v2, b2);
        b3 = _mm512_fmadd_ps(y, v3, b3);
      }
      _mm512_storeu_ps(o0 + d, a0);
      _mm512_storeu_ps(o0 + d + 16, a1);
      _mm512_storeu_ps(o0 + d + 32, a2);
      _mm512_storeu_ps(o0 + d + 48, a3);
      _mm512_storeu_ps(o1 + d, b0);
      _mm512_storeu_ps(o1 + d + 16, b1);
      _mm512_storeu_ps(o1 + d + 32, b2);
      _mm512_storeu_ps(o1 + d + 48, b3);
    }
    return;
  }
#endif
  weighted_acc(p0, n, v, vs, D, o0);
  weighted_acc(p1, n, v, vs, D, o1);
}

#ifdef ETS_VNNI512
// acc + the products of a and b (vpdpbusd: unsigned bytes of a times signed bytes of b, four
// to a dword; vpdpwssd: signed words, two to a dword). GCC 12 treats the intrinsics'
// accumulator as a separate input: it copies it into a fresh register before every
// instruction and back after (measured: the prefill tile's weighted sums spent more of their
// time in those moves than in vpdpwssd). An asm statement that updates its operand in place
// lets the accumulator stay where it is.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
// The same with b one dword broadcast from memory (vpdpwssd only so).
inline __m512i dpbusd(__m512i acc, __m512i a, const int32_t* b) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*b));
  return acc;
}
inline __m512i dpwssd(__m512i acc, __m512i a, const int32_t* b) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*b));
  return acc;
}

// Attention scores of one query vector for 16 int8 keys, exact in int32 before the scales. The
// keys enter vpdpbusd unsigned, u = k + 128, against the query's raw int8 q: with dot = sum q u,
// Q = sum q and U = sum u, sum (q - qz)(k - kz) = dot - Q a - qz b, a = 128 + kz and
// b = U - D a (per key). Times the keys' scales ksc and the query's c.
inline __m512 exact_scores16(__m512i dot, __m512i Q, __m512i qz, __m512i a, __m512i b, __m512 ksc,
                             __m512 c) {
  dot = _mm512_sub_epi32(dot, _mm512_mullo_epi32(Q, a));
  dot = _mm512_sub_epi32(dot, _mm512_mullo_epi32(qz, b));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), ksc), c);
}
#endif

// dst[0..n) = (x[0..n) - zero_point) * scale: one int8 row dequantized.
inline void dequant_row(const int8_t* x, int64_t n, float scale, int32_t zero_point, float* dst) {
  ETS_NEON_IMPL(dequant_row(x, n, scale, zero_point, dst));
  int64_t d = 0;
#ifdef ETS_AVX2
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256 vz = _mm256_set1_ps(static_cast<float>(zero_point));
  for (; d + 8 <= n; d += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + d));
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_sub_ps(f, vz), vs));
  }
#endif
  for (; d < n; ++d) dst[d] = (static_cast<float>(x[d]) - static_cast<float>(zero_point)) * scale;
}

// dst[0..n) = x[0..n) - zero_point as floats (exact: integers below 2^8): an
// int8 row without its scale (the attention kernel applies that to scores and
// probabilities instead).
inline void int8_to_float(const int8_t* x, int64_t n, int32_t zero_point, float* dst) {
  ETS_NEON_IMPL(int8_to_float(x, n, zero_point, dst));
  int64_t d = 0;
#ifdef ETS_AVX2
  const __m256i z = _mm256_set1_epi32(zero_point);
  for (; d + 8 <= n; d += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + d));
    _mm256_storeu_ps(dst + d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepi8_epi32(b), z)));
  }
#endif
  for (; d < n; ++d) dst[d] = static_cast<float>(x[d] - zero_point);
}

// dst[0..n) = x[0..n) - zero_point as int16 (exact).
inline void int8_to_int16(const int8_t* x, int64_t n, int32_t zero_point, int16_t* dst) {
  ETS_NEON_IMPL(int8_to_int16(x, n, zero_point, dst));
  int64_t d = 0;
#ifdef ETS_AVX2
  const __m256i z = _mm256_set1_epi16(static_cast<int16_t>(zero_point));
  for (; d + 16 <= n; d += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), _mm256_sub_epi16(_mm256_cvtepi8_epi16(b), z));
  }
#endif
  for (; d < n; ++d) dst[d] = static_cast<int16_t>(x[d] - zero_point);
}

// res[r] = dot(q, k + r * ks) for r in 0..8, exact in int32 for |q|, |k| < 2^9
// and n <= 2^13 (products below 2^18).
inline void dot8_i16(const int16_t* q, const int16_t* k, int64_t ks, int64_t n, int32_t* res) {
  ETS_NEON_IMPL(dot8_i16(q, k, ks, n, res));
  int64_t d = 0;
#ifdef ETS_AVX2
  __m256i a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_si256();
  for (; d + 16 <= n; d += 16) {
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + d));
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r)
      a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(qv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + r * ks + d))));
  }
  // eight horizontal sums: lane r of the result is the sum of a[r]
  const __m256i s01 = _mm256_hadd_epi32(a[0], a[1]), s23 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i s45 = _mm256_hadd_epi32(a[4], a[5]), s67 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  const __m256i lo = _mm256_permute2x128_si256(s0123, s4567, 0x20);
  const __m256i hi = _mm256_permute2x128_si256(s0123, s4567, 0x31);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(res), _mm256_add_epi32(lo, hi));
#else
  for (int r = 0; r < 8; ++r) res[r] = 0;
#endif
  for (; d < n; ++d)
    for (int r = 0; r < 8; ++r) res[r] += q[d] * k[r * ks + d];
}

inline int32_t dot1_i16(const int16_t* q, const int16_t* k, int64_t n) {
  ETS_NEON_IMPL(dot1_i16(q, k, n));
  int32_t s = 0;
  for (int64_t d = 0; d < n; ++d) s += q[d] * k[d];
  return s;
}

// s[j] = x[j] * scale[j] * c for j < n: exact integer scores to floats.
inline void scale_ints(const int32_t* x, const float* scale, float c, int64_t n, float* s) {
  ETS_NEON_IMPL(scale_ints(x, scale, c, n, s));
  int64_t j = 0;
#ifdef ETS_AVX2
  const __m256 vc = _mm256_set1_ps(c);
  for (; j + 8 <= n; j += 8) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)));
    _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_mul_ps(f, _mm256_loadu_ps(scale + j)), vc));
  }
#endif
  for (; j < n; ++j) s[j] = static_cast<float>(x[j]) * scale[j] * c;
}

// out[j] = a[j] * b[j] for j < n (out may be a).
inline void mul_elems(const float* a, const float* b, int64_t n, float* out) {
  ETS_NEON_IMPL(mul_elems(a, b, n, out));
  int64_t j = 0;
#ifdef ETS_AVX2
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j)));
#endif
  for (; j < n; ++j) out[j] = a[j] * b[j];
}

// x[0..n) *= s.
inline void scale_row(float* x, int64_t n, float s) {
  ETS_NEON_IMPL(scale_row(x, n, s));
  int64_t d = 0;
#ifdef ETS_AVX2
  const __m256 vs = _mm256_set1_ps(s);
  for (; d + 8 <= n; d += 8) _mm256_storeu_ps(x + d, _mm256_mul_ps(_mm256_loadu_ps(x + d), vs));
#endif
  for (; d < n; ++d) x[d] *= s;
}

// Returns max(p[0..n)) (-inf for n == 0).
inline float max_of(const float* p, int64_t n) { return add_max(const_cast<float*>(p), nullptr, n); }

// For the sampler (sampler.cpp), over a whole vocabulary of logits.
#ifdef ETS_AVX2
// Adds the eight lanes of v to two double accumulators (sums of ~10^5 terms stay exact enough).
inline void add_to_pd(__m256 v, __m256d& lo, __m256d& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

inline double hsum_pd(__m256d lo, __m256d hi) {
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(lo, hi));
  return (t[0] + t[1]) + (t[2] + t[3]);
}
#endif

// Sum of exp(x[j] - mx), x unchanged (mx = max(x): every term is in (0, 1]).
inline double sum_exp_shift(const float* x, int64_t n, float mx) {
  ETS_NEON_IMPL(sum_exp_shift(x, n, mx));
  int64_t j = 0;
  double sum = 0;
#ifdef ETS_AVX2
  const __m256 m = _mm256_set1_ps(mx);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; j + 8 <= n; j += 8) add_to_pd(exp256(_mm256_sub_ps(_mm256_loadu_ps(x + j), m)), lo, hi);
  sum = hsum_pd(lo, hi);
#endif
  for (; j < n; ++j) sum += std::exp(static_cast<double>(x[j] - mx));
  return sum;
}

// w[j] = exp((x[j] - mx) * s) for s > 0, exactly 0 where that argument is below -87 (a
// banned, masked or negligible token: e^-87 is 1.6e-38 of the best one's weight) or NaN;
// returns the sum of w.
inline double exp_weights(const float* x, float* w, int64_t n, float mx, float s) {
  ETS_NEON_IMPL(exp_weights(x, w, n, mx, s));
  int64_t j = 0;
  double sum = 0;
#ifdef ETS_AVX2
  const __m256 m = _mm256_set1_ps(mx), vs = _mm256_set1_ps(s), floor = _mm256_set1_ps(-87.0f);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), m), vs);
    const __m256 e = _mm256_and_ps(exp256(a), _mm256_cmp_ps(a, floor, _CMP_GE_OQ));
    _mm256_storeu_ps(w + j, e);
    add_to_pd(e, lo, hi);
  }
  sum = hsum_pd(lo, hi);
#endif
  for (; j < n; ++j) {
    const float a = (x[j] - mx) * s;
    w[j] = a >= -87.0f ? std::exp(a) : 0.0f;
    sum += w[j];
  }
  return sum;
}

}  // namespace etserve::simd

#undef ETS_NEON_IMPL
