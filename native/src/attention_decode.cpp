// One-query-row attention over int8 KV caches: see attention_decode.h.
//
// With x = (q8 - zp) * scale per row, a key row's score for query f (floats,
// times the softmax scale) is k_scale * (f . k8 - k_zp * sum(f)), and a value
// row's contribution to the weighted sum is p * v_scale * (v8 - v_zp): the
// rows are used as stored (int8 converted to float in registers) and the zero
// points enter once per row and head, through sum(f) and through one
// correction per block, sum over the block of p * v_scale * v_zp.
#include "attention_decode.h"

// GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -Wmaybe-uninitialized reports where they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace etserve {

#ifdef ETS_AVX2

namespace {

using namespace simd;

constexpr int64_t kBlock = 64;  // keys per block: its scores stay in L1
// Blocks between the rows prefetched and the rows worked: over a 12k cache, 24 layers, on an
// AMD EPYC, 2, 4 and 8 took 6.9, 7.0 and 7.2 ms a token.
constexpr int64_t kAhead = 2;
constexpr int kMaxG = 8, kMaxD = 128;

// The vector type the kernel works in: 16 floats with AVX-512, else 8.
#ifdef ETS_AVX512
struct Vec {
  using T = __m512;
  static constexpr int W = 16;
  static T cvt(const int8_t* p) {  // W int8 -> floats
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, T v) { _mm512_store_ps(p, v); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static __m256 to8(T v) { return half_sum(v); }  // 8 lanes with the same total
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T exp(T x) { return exp512(x); }
  static float sum(T v) { return hsum256(half_sum(v)); }
};
#else
struct Vec {
  using T = __m256;
  static constexpr int W = 8;
  static T cvt(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, T v) { _mm256_store_ps(p, v); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static __m256 to8(T v) { return v; }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T exp(T x) { return exp256(x); }
  static float sum(T v) { return hsum256(v); }
};
#endif

// One thread's work space (a decode step calls once per layer: kept).
struct alignas(64) Scratch {
  float q[kMaxG * kMaxD];     // queries, dequantized and times the softmax scale
  float acc[kMaxG * kMaxD];   // unnormalized weighted sums
  float part[kMaxG * kBlock * 8];  // per head and key: 8 lanes whose total is the dot product
  float s[kMaxG * kBlock];    // scores, then weights
  float ksc[kBlock], kzp[kBlock], vsc[kBlock], vzp[kBlock];  // the block's row parameters
  float qsum[kMaxG], m[kMaxG], l[kMaxG], zc[kMaxG];
  // int8 queries with VNNI (vnni_block_scores): raw quads, sums, zero points, scales
  int32_t q8[kMaxG * kMaxD / 4];
  int32_t q8sum[kMaxG], q8zp[kMaxG];
  float q8sc[kMaxG];
  int32_t kzi[kBlock];  // the block's key zero points
};

#if defined(ETS_VNNI512)
#define ETS_DECODE_VNNI 1

// 16 rows of 16 dwords (one vector each) -> 16 vectors, vector q holding dword q of every row.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4m + k] now holds, in each 128-bit lane L, dword 4L + k' of rows 4m..4m+3 (k' per k)
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}
#endif

// Not inlined: the kernel then holds a plain pointer, where an inlined
// thread_local would have it ask for the address again in every loop.
__attribute__((noinline)) Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Lines of [p, p + n * stride) elements of `size` bytes, asked for.
inline void prefetch_span(const void* p, int64_t n, int64_t stride, int64_t size) {
  const char* c = static_cast<const char*>(p);
  const int64_t bytes = (n - 1) * stride * size + size;
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

template <int G, int D>
void decode(const AttnArgs& a, int64_t b, int64_t i, int64_t g, int64_t j0, int64_t j1,
            float* pm, float* pl, float* pacc) {
  using T = Vec::T;
  constexpr int W = Vec::W, NC = D / W;
  Scratch& sc = scratch();

  for (int h = 0; h < G; ++h) {
    float* dst = sc.q + h * D;
    const int64_t hq = g * G + h;
    if (a.q.f32 != nullptr) {
      const float* src = a.q.f32 + b * a.q.sb + i * a.q.ss + hq * a.q.sh;
      for (int d = 0; d < D; ++d) dst[d] = src[d] * a.scale;
    } else {
      const float qs = a.q.scale[b * a.q.sc_sb + i * a.q.sc_ss + hq * a.q.sc_sh];
      const int32_t qz = a.q.zero_point[b * a.q.zp_sb + i * a.q.zp_ss + hq * a.q.zp_sh];
      dequant_row(a.q.i8 + b * a.q.sb + i * a.q.ss + hq * a.q.sh, D, qs * a.scale, qz, dst);
    }
#if defined(ETS_DECODE_VNNI)
    if (a.q.i8 != nullptr) {
      const int8_t* src = a.q.i8 + b * a.q.sb + i * a.q.ss + hq * a.q.sh;
      std::memcpy(sc.q8 + h * (D / 4), src, D);
      int32_t sum = 0;
      for (int d = 0; d < D; ++d) sum += src[d];
      sc.q8sum[h] = sum;
      sc.q8zp[h] = a.q.zero_point[b * a.q.zp_sb + i * a.q.zp_ss + hq * a.q.zp_sh];
      sc.q8sc[h] = a.q.scale[b * a.q.sc_sb + i * a.q.sc_ss + hq * a.q.sc_sh] * a.scale;
    }
#endif
    float s = 0;
    for (int d = 0; d < D; ++d) s += dst[d];
    sc.qsum[h] = s;
    sc.m[h] = -INFINITY;
    sc.l[h] = 0.f;
    std::fill(sc.acc + h * D, sc.acc + (h + 1) * D, 0.f);
  }

  int64_t lim = a.n_kv;
  if (a.causal) lim = std::min(lim, a.start_pos + i + 1);
  const int64_t jend = std::min(j1, lim);
  const AttnOperand &K = a.k, &V = a.v;
  const int8_t* kd = K.i8 + b * K.sb + g * K.sh;
  const int8_t* vd = V.i8 + b * V.sb + g * V.sh;
  const float* ks = K.scale + b * K.sc_sb + g * K.sc_sh;
  const float* vs = V.scale + b * V.sc_sb + g * V.sc_sh;
  const int8_t* kz = K.zero_point + b * K.zp_sb + g * K.zp_sh;
  const int8_t* vz = V.zero_point + b * V.zp_sb + g * V.zp_sh;
  const float* mrow = a.mask ? a.mask + i * a.mask_ss : nullptr;

  for (int64_t jb = j0; jb < jend; jb += kBlock) {
    const int64_t len = std::min(kBlock, jend - jb);
    // The row parameters of the block kAhead blocks on (its rows come one by one below).
    const int64_t ahead = jb + kAhead * kBlock;
    const int64_t n_ahead = std::min(kBlock, jend - ahead);
    if (n_ahead > 0) {
      prefetch_span(ks + ahead * K.sc_ss, n_ahead, K.sc_ss, sizeof(float));
      prefetch_span(vs + ahead * V.sc_ss, n_ahead, V.sc_ss, sizeof(float));
      prefetch_span(kz + ahead * K.zp_ss, n_ahead, K.zp_ss, 1);
      prefetch_span(vz + ahead * V.zp_ss, n_ahead, V.zp_ss, 1);
    }
    int64_t jp = 0;
#if defined(ETS_AVX512) && defined(__AVX512BW__)
    // Two kv heads (a model's usual stride of 2 in all four): 16 rows' parameters at a time.
    if (K.sc_ss == 2 && V.sc_ss == 2 && K.zp_ss == 2 && V.zp_ss == 2) {
      const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      for (; jp < len; jp += 16) {
        const int64_t n = std::min<int64_t>(16, len - jp);
        const __mmask16 m16 = static_cast<__mmask16>((1u << n) - 1);
        const __mmask16 lo = static_cast<__mmask16>(n > 8 ? 0xFFFF : (1u << (2 * n - 1)) - 1);
        const __mmask16 hi = static_cast<__mmask16>(n > 8 ? (1u << (2 * (n - 8) - 1)) - 1 : 0);
        const __mmask32 m8 = static_cast<__mmask32>((uint64_t(1) << (2 * n - 1)) - 1);
        auto gather2 = [&](const float* base) {  // base[0], base[2], ... base[2 (n - 1)]
          const __m512 a = _mm512_maskz_loadu_ps(lo, base), b = _mm512_maskz_loadu_ps(hi, base + 16);
          return _mm512_permutex2var_ps(a, even, b);
        };
        auto zeros2 = [&](const int8_t* base) {  // the same of int8 zero points, as int32
          const __m512i w = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m8, base));
          return _mm512_srai_epi32(_mm512_slli_epi32(w, 16), 16);
        };
        _mm512_mask_storeu_ps(sc.ksc + jp, m16, gather2(ks + (jb + jp) * 2));
        _mm512_mask_storeu_ps(sc.vsc + jp, m16, gather2(vs + (jb + jp) * 2));
        const __m512i kzv = zeros2(kz + (jb + jp) * 2), vzv = zeros2(vz + (jb + jp) * 2);
        _mm512_mask_storeu_epi32(sc.kzi + jp, m16, kzv);
        _mm512_mask_storeu_ps(sc.kzp + jp, m16, _mm512_cvtepi32_ps(kzv));
        _mm512_mask_storeu_ps(sc.vzp + jp, m16, _mm512_cvtepi32_ps(vzv));
      }
    }
#endif
    for (int64_t j = jp; j < len; ++j) {
      sc.ksc[j] = ks[(jb + j) * K.sc_ss];
      sc.kzi[j] = kz[(jb + j) * K.zp_ss];
      sc.kzp[j] = static_cast<float>(sc.kzi[j]);
      sc.vsc[j] = vs[(jb + j) * V.sc_ss];
      sc.vzp[j] = static_cast<float>(vz[(jb + j) * V.zp_ss]);
    }

#if defined(ETS_DECODE_VNNI)
    if (a.q.i8 != nullptr) {
      // Exact int32 scores (simd.h's exact_scores16): 16 keys at a time transposed in
      // registers, D / 4 vpdpbusd per head.
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), ones = _mm512_set1_epi8(1);
      for (int64_t c = 0; c < len; c += 16) {
        const int64_t cnt = std::min<int64_t>(16, len - c);
        __m512i dots[G];
        for (int h = 0; h < G; ++h) dots[h] = _mm512_setzero_si512();
        __m512i U = _mm512_setzero_si512();
        for (int half = 0; half < D / 64; ++half) {
          __m512i r[16];
          for (int x = 0; x < 16; ++x) {
            r[x] = x < cnt ? _mm512_xor_si512(_mm512_loadu_si512(kd + (jb + c + x) * K.ss + half * 64), flip)
                           : _mm512_setzero_si512();
            if (c + x < n_ahead) {
              _mm_prefetch(reinterpret_cast<const char*>(kd + (ahead + c + x) * K.ss + half * 64), _MM_HINT_T0);
              _mm_prefetch(reinterpret_cast<const char*>(vd + (ahead + c + x) * V.ss + half * 64), _MM_HINT_T0);
            }
          }
          transpose16(r);
          for (int q = 0; q < 16; ++q) {
            U = _mm512_dpbusd_epi32(U, r[q], ones);
            for (int h = 0; h < G; ++h)
              dots[h] = _mm512_dpbusd_epi32(dots[h], r[q], _mm512_set1_epi32(sc.q8[h * (D / 4) + half * 16 + q]));
          }
        }
        const __m512i A = _mm512_add_epi32(_mm512_set1_epi32(128), _mm512_loadu_si512(sc.kzi + c));
        const __m512i B = _mm512_sub_epi32(U, _mm512_mullo_epi32(_mm512_set1_epi32(D), A));
        const __m512 ksv = _mm512_loadu_ps(sc.ksc + c);
        for (int h = 0; h < G; ++h)
          _mm512_store_ps(sc.s + h * kBlock + c,
                          exact_scores16(dots[h], _mm512_set1_epi32(sc.q8sum[h]), _mm512_set1_epi32(sc.q8zp[h]),
                                         A, B, ksv, _mm512_set1_ps(sc.q8sc[h])));
      }
    } else
#endif
    {
    // Dot products: per key row, G vectors of partial sums.
      for (int64_t j = 0; j < len; ++j) {
        const int8_t* kr = kd + (jb + j) * K.ss;
        if (j < n_ahead) {
          for (int o = 0; o < D; o += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(kr + kAhead * kBlock * K.ss + o), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(vd + (ahead + j) * V.ss + o), _MM_HINT_T0);
          }
        }
        T kc[NC];
        for (int c = 0; c < NC; ++c) kc[c] = Vec::cvt(kr + c * W);
        for (int h = 0; h < G; ++h) {
          const float* q = sc.q + h * D;
          T x = Vec::mul(Vec::load(q), kc[0]);
          for (int c = 1; c < NC; ++c) x = Vec::fma(Vec::load(q + c * W), kc[c], x);
          _mm256_store_ps(sc.part + (h * kBlock + j) * 8, Vec::to8(x));
        }
      }
      // Scores: eight keys' sums at a time, less the zero points', times the scales.
      for (int h = 0; h < G; ++h) {
        float* srow = sc.s + h * kBlock;
        const float* p = sc.part + h * kBlock * 8;
        const __m256 qsum = _mm256_set1_ps(sc.qsum[h]);
        int64_t j = 0;
        for (; j + 8 <= len; j += 8) {
          const float* pj = p + j * 8;
          const __m256 dots = hsum8x8(_mm256_load_ps(pj), _mm256_load_ps(pj + 8), _mm256_load_ps(pj + 16),
                                      _mm256_load_ps(pj + 24), _mm256_load_ps(pj + 32), _mm256_load_ps(pj + 40),
                                      _mm256_load_ps(pj + 48), _mm256_load_ps(pj + 56));
          _mm256_store_ps(srow + j, _mm256_mul_ps(_mm256_load_ps(sc.ksc + j),
                                                  _mm256_fnmadd_ps(_mm256_load_ps(sc.kzp + j), qsum, dots)));
        }
        for (; j < len; ++j) srow[j] = sc.ksc[j] * (hsum256(_mm256_load_ps(p + j * 8)) - sc.kzp[j] * sc.qsum[h]);
      }
    }
    // Online softmax; the weights times the value scales, and their zero-point correction.
    for (int h = 0; h < G; ++h) {
      float* srow = sc.s + h * kBlock;
      const float bm = add_max(srow, mrow ? mrow + jb : nullptr, len);
      const float mn = std::max(sc.m[h], bm);
      if (!(mn > -INFINITY)) {  // everything so far masked out
        std::fill(srow, srow + len, 0.f);
        sc.zc[h] = 0.f;
        continue;
      }
      const float corr = sc.m[h] > -INFINITY ? std::exp(sc.m[h] - mn) : 0.f;
      if (corr != 1.f) scale_row(sc.acc + h * D, D, corr);
      // One pass: e = exp(s - mn) summed; the weight e * v_scale stored; e * v_scale * v_zp summed.
      const T vmn = Vec::set1(mn);
      T vsum = Vec::set1(0.f), vzc = Vec::set1(0.f);
      int64_t j = 0;
      for (; j + W <= len; j += W) {
        const T e = Vec::exp(Vec::sub(Vec::load(srow + j), vmn));
        const T w = Vec::mul(e, Vec::load(sc.vsc + j));
        Vec::store(srow + j, w);
        vsum = Vec::add(vsum, e);
        vzc = Vec::fma(w, Vec::load(sc.vzp + j), vzc);
      }
      float sum = Vec::sum(vsum), zc = Vec::sum(vzc);
      for (; j < len; ++j) {
        const float e = std::exp(srow[j] - mn);
        srow[j] = e * sc.vsc[j];
        sum += e;
        zc += srow[j] * sc.vzp[j];
      }
      sc.l[h] = sc.l[h] * corr + sum;
      sc.m[h] = mn;
      sc.zc[h] = zc;
    }
    // Weighted sums: a slice of the head dimension at a time, all G heads in registers.
    for (int c = 0; c < NC; ++c) {
      T o[G];
      for (int h = 0; h < G; ++h) o[h] = Vec::load(sc.acc + h * D + c * W);
      const int8_t* vr = vd + jb * V.ss + c * W;
      for (int64_t j = 0; j < len; ++j, vr += V.ss) {
        const T v = Vec::cvt(vr);
        for (int h = 0; h < G; ++h) o[h] = Vec::fma(Vec::bcast(sc.s + h * kBlock + j), v, o[h]);
      }
      for (int h = 0; h < G; ++h) Vec::store(sc.acc + h * D + c * W, Vec::sub(o[h], Vec::set1(sc.zc[h])));
    }
  }

  for (int h = 0; h < G; ++h) {
    const float* acc = sc.acc + h * D;
    if (pm != nullptr) {
      pm[h] = sc.m[h];
      pl[h] = sc.l[h];
      std::copy(acc, acc + D, pacc + h * D);
      continue;
    }
    float* dst = a.o + b * a.o_sb + i * a.o_ss + (g * G + h) * a.o_sh;
    const float s = sc.l[h] > 0.f ? 1.f / sc.l[h] : 0.f;  // nothing visible: zeros
    for (int d = 0; d < D; ++d) dst[d] = acc[d] * s;
  }
}

using DecodeFn = void (*)(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, float*,
                          float*, float*);

template <int D>
DecodeFn pick_g(int64_t G) {
  switch (G) {
    case 1: return decode<1, D>;
    case 2: return decode<2, D>;
    case 3: return decode<3, D>;
    case 4: return decode<4, D>;
    case 5: return decode<5, D>;
    case 6: return decode<6, D>;
    case 7: return decode<7, D>;
    case 8: return decode<8, D>;
    default: return nullptr;
  }
}

DecodeFn pick(const AttnArgs& a) {
  if (a.Hkv <= 0 || a.H % a.Hkv != 0) return nullptr;
  const int64_t G = a.H / a.Hkv;
  if (a.D == 64) return pick_g<64>(G);
  if (a.D == 128) return pick_g<128>(G);
  return nullptr;
}

}  // namespace

bool decode_attention_applies(const AttnArgs& a) {
  return a.k.i8 != nullptr && a.v.i8 != nullptr && a.k.tiled == 0 && a.v.tiled == 0 &&
         pick(a) != nullptr;
}

void attend_decode(const AttnArgs& a, int64_t b, int64_t i, int64_t g, int64_t j0, int64_t j1,
                   float* m, float* l, float* acc) {
  pick(a)(a, b, i, g, j0, j1, m, l, acc);
}

#else  // no AVX2: attention.cpp's generic tile runs these rows

bool decode_attention_applies(const AttnArgs&) { return false; }

void attend_decode(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*,
                   float*) {}

#endif

}  // namespace etserve
