// One-query-row attention over int8 KV caches: see attention_decode.h.
//
// With x = (q8 - zp) * scale per row, a key row's score for query f (floats,
// times the softmax scale) is k_scale * (f . k8 - k_zp * sum(f)), and a value
// row's contribution to the weighted sum is p * v_scale * (v8 - v_zp): the
// rows are used as stored (int8 converted in registers) and the zero points
// enter once per row and head, through sum(f) and through one correction per
// block, sum over the block of p * v_scale * v_zp. With AVX-512 VNNI both
// products are integer: exact int32 scores (simd.h's exact_scores16), and the
// weights p * v_scale as 8-bit fixed point per block (vnni_weighted_sums); with
// AVX2 too: exact int32 scores (vpmaddwd) and 7-bit weights (w7_weighted_sums).
#include "attention_decode.h"

// GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -Wmaybe-uninitialized reports where they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "isa.h"
#include "kv_layout.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace etserve {

#ifdef ETS_AVX2

namespace {

using namespace simd;

constexpr int64_t kBlock = 64;  // keys per block: its scores stay in L1
// Blocks between the rows prefetched into L1 and the rows worked (over a 12k cache, 24 layers,
// on an AMD EPYC, 1, 2 and 4 measured alike; 8 slower).
constexpr int64_t kAhead = 2;
// And further on into L2 only (prefetcht1): a second level that keeps more lines in flight
// from memory. 12k cache, 24 layers: 4.1-4.2 ms without, 3.6-3.8 ms with it at 4 to 8 blocks.
constexpr int64_t kFar = 6;
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

#if !defined(ETS_AVX512)
// Four vectors of two keys each (key 2i in the low half of vector i, key 2i + 1 in the high
// half, four int32 lanes apiece) -> lane r the total of key (0, 2, 4, 6, 1, 3, 5, 7)[r]: three
// levels of vphaddd's adds, each through two vshufps (measured on an AMD EPYC: vphaddd issues once
// every two cycles, a shuffle twice a cycle).
inline __m256i hadd3(const int32_t* p) {
  auto hadd = [](__m256 a, __m256 b) {
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)),
                                                _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD))));
  };
  auto ld = [p](int r) { return _mm256_load_ps(reinterpret_cast<const float*>(p + 8 * r)); };
  return _mm256_castps_si256(hadd(hadd(ld(0), ld(1)), hadd(ld(2), ld(3))));
}
#endif

// One thread's work space (a decode step calls once per layer: kept). Per query head t (all H of
// them: t = g * G + h) the running state; per block the one kv head's work.
constexpr int kMaxH = 64;
struct alignas(64) Scratch {
  float q[kMaxH * kMaxD];     // queries, dequantized and times the softmax scale
  float acc[kMaxH * kMaxD];   // unnormalized weighted sums
  float qsum[kMaxH], m[kMaxH], l[kMaxH];
  // int8 queries with VNNI (exact scores): raw quads, sums, zero points, scales
  int32_t q8[kMaxH * kMaxD / 4];
  int32_t q8sum[kMaxH], q8zp[kMaxH];
  float q8sc[kMaxH];
  // one kv head's block
  float part[kMaxG * kBlock * 8];  // per head and key: 8 lanes whose total is the dot product
  float s[kMaxG * kBlock];    // scores, then weights
  float ksc[kBlock], kzp[kBlock], vsc[kBlock], vzp[kBlock];  // the block's row parameters
  float lv[kBlock], rv[kBlock];  // VNNI: log2 and reciprocals of the value scales
  float zc[kMaxG];
  int32_t kzi[kBlock], vzi[kBlock];  // the block's zero points
  // VNNI weighted sums: per head the block's weights as unsigned bytes (fixed point), their
  // scale, and sum(weight * value zero point) in those units
  alignas(64) uint8_t wq[kMaxG * kBlock];
  int32_t wzc[kMaxG];
  float wsc[kMaxG];
#if !defined(ETS_AVX512)
  // AVX2 (ETS_DECODE_I16): the int8 queries less their zero points as int16, each 8 dims twice
  // (the scores take two keys a vector); per head and pair of keys 4 + 4 lanes of int32 dot
  // products; per head the block's maxima of the scores and of y (w7_softmax)
  alignas(32) int16_t q2[kMaxH * kMaxD * 2];
  alignas(32) int32_t ipart[kMaxG * kBlock * 4];
  __m256 smax[8], ymax[8];
  // from tiled caches (kv_layout.h, D 64): per query head and dim quad two int16 pairs of
  // its query less the zero point, (q0, q2) and (q1, q3), each broadcast to a vector
  __m256i qt[kMaxH * 32];
#endif
};

#if !defined(ETS_AVX512)
// AVX2 (no VNNI): exact int32 scores through vpmaddwd (signed words, two products to a dword),
// the int8 keys sign-extended to int16 and the query less its zero point, q' = q - qz (at most
// 255 in magnitude: each product fits a word's pair sum): with Q' = sum q',
// sum (q - qz)(k - kz) = sum q' k - kz Q' (at most 255 * 255 * D < 2^23). Half the
// instructions of the float dot products (16 products each where an FMA does 8), no conversion
// of the keys to floats, no key sums, and the zero points subtracted exactly. The weighted sums
// are integer too, with 7-bit weights (w7_softmax, w7_weighted_sums).
#define ETS_DECODE_I16 1
#endif

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

// Lanes [0, min(n, 16)).
inline __mmask16 tail_mask16(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1); }

// acc += wsc * (sum over the block's value rows of u * (v8 - v_zp)), per head, with u the
// weights as unsigned bytes (vnni_softmax): sum(u * v8) - wzc, 32 dims at a time. Four keys'
// rows are interleaved a byte each into every dword, so that one vpdpbusd takes the four keys
// of 16 dims against their weights, one dword broadcast per head; exact in int32 (at most
// 64 * 255 * 128 < 2^21). The lanes come out in the order vnni_unorder undoes.
template <int G, int D>
inline void vnni_weighted_sums(Scratch& sc, float* acc0, const int8_t* v, int64_t ss, int64_t len,
                               int64_t n_ahead, int64_t n_far) {
#if defined(__AVX512VBMI__)
  // dword 4L + k of the first vector: dim 8L + k of rows a, b (first table), c, d (second); of
  // the second vector dim 8L + 4 + k (the unpacking path's order)
  alignas(64) static const struct Idx {
    uint8_t x[2][64];
    Idx() {
      for (int o = 0; o < 2; ++o)
        for (int L = 0; L < 4; ++L)
          for (int k = 0; k < 4; ++k)
            for (int r = 0; r < 4; ++r)
              x[o][16 * L + 4 * k + r] = static_cast<uint8_t>((r / 2) * 64 + (r % 2) * 32 + 8 * L + 4 * o + k);
    }
  } idx;
  const __m512i ix0 = _mm512_load_si512(idx.x[0]), ix1 = _mm512_load_si512(idx.x[1]);
#endif
  for (int c = 0; c < D / 32; ++c) {
    const int8_t* vr = v + c * 32;
    auto row = [&](int64_t j) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + j * ss)); };
    __m512i o[G][2];
    for (int h = 0; h < G; ++h) o[h][0] = o[h][1] = _mm512_setzero_si512();
    // rows a, b, c, d (32 bytes each) -> x0, x1: dwords of their four bytes at one dim
    auto quad = [&](__m256i ra, __m256i rb, __m256i rc, __m256i rd, int64_t j) {
#if defined(__AVX512VBMI__)
      const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(ra), rb, 1);
      const __m512i cd = _mm512_inserti64x4(_mm512_castsi256_si512(rc), rd, 1);
      const __m512i x0 = _mm512_permutex2var_epi8(ab, ix0, cd), x1 = _mm512_permutex2var_epi8(ab, ix1, cd);
#else
      const __m512i wab = _mm512_or_si512(_mm512_cvtepu8_epi16(ra), _mm512_slli_epi16(_mm512_cvtepu8_epi16(rb), 8));
      const __m512i wcd = _mm512_or_si512(_mm512_cvtepu8_epi16(rc), _mm512_slli_epi16(_mm512_cvtepu8_epi16(rd), 8));
      const __m512i x0 = _mm512_unpacklo_epi16(wab, wcd), x1 = _mm512_unpackhi_epi16(wab, wcd);
#endif
      const uint8_t* wb = sc.wq + j;  // the heads' weights at constant offsets from it
      asm("" : "+r"(wb));
      for (int h = 0; h < G; ++h) {
        const __m512i w = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(wb + h * kBlock));
        o[h][0] = dpbusd(o[h][0], w, x0);
        o[h][1] = dpbusd(o[h][1], w, x1);
      }
    };
    // The rows kAhead blocks on (and kFar, into L2), asked for four at a time: the slices
    // of 64 bytes.
    const bool ask = c % 2 == 0;
    const int8_t* far = vr + kAhead * kBlock * ss;
    const int8_t* far2 = vr + kFar * kBlock * ss;
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
      if (ask)
        for (int x = 0; x < 4; ++x) {
          if (j + x < n_ahead) _mm_prefetch(reinterpret_cast<const char*>(far + (j + x) * ss), _MM_HINT_T0);
          if (j + x < n_far) _mm_prefetch(reinterpret_cast<const char*>(far2 + (j + x) * ss), _MM_HINT_T1);
        }
      quad(row(j), row(j + 1), row(j + 2), row(j + 3), j);
    }
    if (j < len) {  // 1-3 rows left: the rest zeros (their weights are 0 too)
      const __m256i z = _mm256_setzero_si256();
      quad(row(j), j + 1 < len ? row(j + 1) : z, j + 2 < len ? row(j + 2) : z, z, j);
    }
    if (ask)
      for (int64_t x = j; x < n_ahead; ++x) _mm_prefetch(reinterpret_cast<const char*>(far + x * ss), _MM_HINT_T0);
    for (int h = 0; h < G; ++h) {
      const __m512i zc = _mm512_set1_epi32(sc.wzc[h]);
      const __m512 s = _mm512_set1_ps(sc.wsc[h]);
      float* acc = acc0 + h * D + c * 32;
      _mm512_store_ps(acc, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(o[h][0], zc)), s, _mm512_load_ps(acc)));
      _mm512_store_ps(acc + 16,
                      _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(o[h][1], zc)), s, _mm512_load_ps(acc + 16)));
    }
  }
}

// vnni_weighted_sums' lane order, per 32 dims: lane 4L + k of the first vector is dim 8L + k,
// of the second dim 8L + 4 + k (L < 4, k < 4; unpacking works within 128-bit lanes).
template <int D>
inline void vnni_unorder(float* acc) {
  for (int c = 0; c < D; c += 32) {
    float t[32];
    std::memcpy(t, acc + c, sizeof t);
    for (int L = 0; L < 4; ++L)
      for (int k = 0; k < 4; ++k) {
        acc[c + 8 * L + k] = t[4 * L + k];
        acc[c + 8 * L + 4 + k] = t[16 + 4 * L + k];
      }
  }
}
// Lane h of the result (h < 8): op over the lanes of v[h]. Eight reductions in 24 shuffles and
// ops and five steps of latency, where eight _mm512_reduce_* would take some 64 in eight chains.
template <typename Op>
inline __m512 reduce8(const __m512 v[8], Op op) {
  __m512 r[4];
  for (int i = 0; i < 4; ++i)  // 128-bit blocks 0-1: v[2i]'s halves combined; 2-3: v[2i + 1]'s
    r[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  // block b of x: v[b]'s quarter, of y: v[4 + b]'s
  const __m512 x = op(_mm512_shuffle_f32x4(r[0], r[1], 0x88), _mm512_shuffle_f32x4(r[0], r[1], 0xDD));
  const __m512 y = op(_mm512_shuffle_f32x4(r[2], r[3], 0x88), _mm512_shuffle_f32x4(r[2], r[3], 0xDD));
  // per block b: x's pairs, y's pairs, then lanes 4b and 4b + 2 the totals of v[b] and v[4 + b]
  const __m512 t = op(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
  const __m512 u = op(t, _mm512_permute_ps(t, 0xB1));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0), u);
}

// The block's online softmax for the G query heads of one kv head (state at t0), ending in
// vnni_weighted_sums' weights:
//  - per head bm = max(s) over the block; mn = max(m, bm) the new running max; what the head
//    summed before times corr = e^(m - mn);
//  - the weights p v_scale, p = e^(s - mn), as 8-bit fixed point in one pass of exponentials,
//    in base 2: with y = (s - bm) log2(e) + log2(v_scale) and bp = max(y) over the block,
//    u = round(2^(y - bp + log2(255))), at most 255: the block's largest weight at 255 exactly,
//    as if all were divided by it (an error of at most 2^-9 of it per key; the int8 values'
//    own rounding is up to 2^-8 of their row's largest), with the scale
//    wsc = 2^(bp + (bm - mn) log2(e)) / 255, and wzc = sum(u v_zp), exact;
//  - the sum of the p as rounded: l = l corr + wsc sum(u / v_scale), so that the weights the
//    values get and the sum they are divided by agree.
// Scores stay differences (s - bm, bm - mn) before they are scaled, exact where they are close.
// Each pass runs over the block's 16-key vectors with the heads innermost (G independent chains
// of work in flight), the heads' reductions batched (reduce8) and their results as lanes.
template <int G>
inline void vnni_softmax(Scratch& sc, int64_t t0, int64_t D, int64_t len, const float* mrow) {
  const __m512 lowest = _mm512_set1_ps(-INFINITY), log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 zero = _mm512_setzero_ps();
  const int64_t nv = (len + 15) / 16;
  const __mmask16 hm = static_cast<__mmask16>((1u << G) - 1);
  auto vmax = [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); };
  auto vadd = [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); };
  // the value scales' log2 and reciprocals (a scale of 0 taken as 1e-30: its key's values add
  // nothing, its weight still counts in the sum)
  for (int64_t j = 0; j < len; j += 16) {
    const __m512 v = _mm512_max_ps(_mm512_maskz_loadu_ps(tail_mask16(len - j), sc.vsc + j), _mm512_set1_ps(1e-30f));
    _mm512_storeu_ps(sc.lv + j, log2_512(v));
    _mm512_storeu_ps(sc.rv + j, _mm512_div_ps(_mm512_set1_ps(1.f), v));
  }
  __m512 r[8];
  for (int h = 0; h < 8; ++h) r[h] = lowest;
  for (int64_t v = 0; v < nv; ++v) {  // bm, the mask added to the scores first
    const __mmask16 m = tail_mask16(len - 16 * v);
    const __m512 mk = mrow ? _mm512_maskz_loadu_ps(m, mrow + 16 * v) : zero;
    for (int h = 0; h < G; ++h) {
      float* p = sc.s + h * kBlock + 16 * v;
      __m512 x = _mm512_mask_loadu_ps(lowest, m, p);
      if (mrow) {
        x = _mm512_add_ps(x, mk);
        _mm512_mask_storeu_ps(p, m, x);
      }
      r[h] = _mm512_max_ps(r[h], x);
    }
  }
  alignas(64) float bm[16], bp[16], corr[16];
  // the heads as lanes
  const __m512 mo = _mm512_mask_loadu_ps(lowest, hm, sc.m + t0);
  const __m512 bv = _mm512_mask_mov_ps(lowest, hm, reduce8(r, vmax));
  const __m512 mn = _mm512_max_ps(mo, bv);
  const __mmask16 before = _mm512_cmp_ps_mask(mo, lowest, _CMP_GT_OQ);  // keys seen before
  const __mmask16 here = _mm512_cmp_ps_mask(bv, lowest, _CMP_GT_OQ);    // keys visible here
  const __m512 cv = _mm512_maskz_mov_ps(before, exp2_512(_mm512_mul_ps(_mm512_sub_ps(mo, mn), log2e)));
  _mm512_store_ps(corr, cv);
  _mm512_mask_storeu_ps(sc.m + t0, hm, mn);
  for (int h = 0; h < G; ++h)
    if ((before >> h) & 1 && corr[h] != 1.f) scale_row(sc.acc + (t0 + h) * D, D, corr[h]);
  // A head with nothing visible (every score -inf: masked) works on 0 in place of bm and bp:
  // its rows stay -inf, its weights 0 and wsc 0, nothing NaN.
  _mm512_store_ps(bm, _mm512_maskz_mov_ps(here, bv));

  __m512 b[G];
  for (int h = 0; h < G; ++h) {
    b[h] = _mm512_set1_ps(bm[h]);
    r[h] = lowest;
  }
  for (int64_t v = 0; v < nv; ++v) {  // y, and bp
    const __mmask16 m = tail_mask16(len - 16 * v);
    const __m512 lv = _mm512_loadu_ps(sc.lv + 16 * v);
    for (int h = 0; h < G; ++h) {
      float* p = sc.s + h * kBlock + 16 * v;
      const __m512 y = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_loadu_ps(p), b[h]), log2e, lv);
      r[h] = _mm512_mask_max_ps(r[h], m, r[h], y);
      _mm512_storeu_ps(p, y);
    }
  }
  const __m512 bpv = _mm512_maskz_mov_ps(here, reduce8(r, vmax));
  _mm512_store_ps(bp, bpv);
  const __m512 wv = _mm512_maskz_mov_ps(
      here, _mm512_mul_ps(exp2_512(_mm512_fmadd_ps(_mm512_sub_ps(bv, mn), log2e, bpv)), _mm512_set1_ps(1.f / 255.f)));
  _mm512_mask_storeu_ps(sc.wsc, hm, wv);

  const __m512 top = _mm512_set1_ps(255.f);
  __m512 zc[8];
  for (int h = 0; h < 8; ++h) r[h] = zc[h] = zero;
  for (int h = 0; h < G; ++h) b[h] = _mm512_set1_ps(bp[h] - 7.99435343685886f);  // log2(255)
  for (int64_t v = 0; v < nv; ++v) {  // the weights, their sum and zero-point sum
    const __mmask16 m = tail_mask16(len - 16 * v);
    const __m512 rv = _mm512_loadu_ps(sc.rv + 16 * v);
    const __m512 vz = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, sc.vzi + 16 * v));
    for (int h = 0; h < G; ++h) {
      const __m512 w = _mm512_maskz_mov_ps(m, exp2_512(_mm512_sub_ps(_mm512_loadu_ps(sc.s + h * kBlock + 16 * v), b[h])));
      const __m512 u = _mm512_min_ps(_mm512_roundscale_ps(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), top);
      r[h] = _mm512_fmadd_ps(u, rv, r[h]);  // the weights as rounded: they and l agree
      _mm_store_si128(reinterpret_cast<__m128i*>(sc.wq + h * kBlock + 16 * v), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(u)));
      zc[h] = _mm512_fmadd_ps(u, vz, zc[h]);  // integers below 2^24: exact
    }
  }
  const __m512 S = reduce8(r, vadd);
  _mm512_mask_storeu_epi32(sc.wzc, hm, _mm512_maskz_mov_epi32(here, _mm512_cvtps_epi32(reduce8(zc, vadd))));
  const __m512 l = _mm512_maskz_loadu_ps(hm, sc.l + t0);
  _mm512_mask_storeu_ps(sc.l + t0, hm, _mm512_fmadd_ps(l, cv, _mm512_mul_ps(wv, S)));
}
#endif

#if defined(ETS_DECODE_I16)
// AVX2's weighted sums in integers, as the VNNI kernel's (vnni_softmax, vnni_weighted_sums) but
// with the weights as 7-bit fixed point per head and 64-key block: vpmaddubsw (unsigned bytes
// times signed bytes, two products to a signed word, saturating) stays exact only while both
// products' sum fits a word, 2 * 127 * 128 < 2^15; vpmaddwd against ones then adds the two
// words of a dword, four keys' products. Two multiplies for 32 products, where the float sums
// took four FMAs, four conversions and four broadcasts: the largest part of a long decode.
constexpr float kW7Top = 127.f, kLog2W7Top = 6.988684686772166f;  // log2(127)

// Lane h of the result (h < 8): op over the lanes of v[h], in 21 shuffles and ops.
template <typename Op>
inline __m256 reduce8x8(const __m256 v[8], Op op) {
  __m256 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: v[2i]'s and v[2i + 1]'s pairs
    t[i] = op(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i)  // per 128-bit lane: v[4i..4i + 3]'s quarters
    u[i] = op(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  return op(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

// Before the block's scores: the value scales' log2 and reciprocals (a scale of 0 taken as 1e-30,
// as the VNNI kernel); the last vector's lanes past len weigh nothing.
inline void w7_prepare(Scratch& sc, int64_t len) {
  const int64_t nv = (len + 7) / 8;
  for (int64_t j = len; j < nv * 8; ++j) {
    sc.vsc[j] = 1.f;
    sc.vzp[j] = 0.f;
  }
  for (int64_t v = 0; v < nv; ++v) {
    const __m256 x = _mm256_max_ps(_mm256_load_ps(sc.vsc + 8 * v), _mm256_set1_ps(1e-30f));
    _mm256_store_ps(sc.lv + 8 * v, log2_256(x));
    _mm256_store_ps(sc.rv + 8 * v, _mm256_div_ps(_mm256_set1_ps(1.f), x));
  }
}

// Where the scores are made, head by head (head): score(j) gives the scores s of keys
// [j, j + 8) of head h without the mask row (added here), lanes from `len` on past the block
// (-inf here). Keeps y = s log2(e) + log2(v_scale) in sc.s for w7_softmax, and per head the
// maxima of s and of y.
class W7Scores {
  const float* mr;  // the mask row at the block's first key, or null
  int64_t len;
  __m256i tail;  // the lanes of the block's last vector that are keys
 public:
  W7Scores(const float* mrow, int64_t n) : mr(mrow), len(n) {
    const int64_t t = n % 8 ? n % 8 : 8;
    tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(t)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  template <typename Score>
  void head(Scratch& sc, int h, Score score) const {
    __m256 smax = _mm256_set1_ps(-INFINITY), ymax = smax;
    for (int64_t j = 0; j < len; j += 8) put(sc, h, j, score(j), smax, ymax);
    sc.smax[h] = smax;
    sc.ymax[h] = ymax;
  }

  // The scores s of keys [j, j + 8) of head h (the mask row added here), into the maxima.
  void put(Scratch& sc, int h, int64_t j, __m256 s, __m256& smax, __m256& ymax) const {
    const bool last = j + 8 > len;
    if (mr) s = _mm256_add_ps(s, last ? _mm256_maskload_ps(mr + j, tail) : _mm256_loadu_ps(mr + j));
    if (last) s = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, _mm256_castsi256_ps(tail));
    const __m256 y = _mm256_fmadd_ps(s, _mm256_set1_ps(kLog2e), _mm256_load_ps(sc.lv + j));
    smax = _mm256_max_ps(smax, s);
    ymax = _mm256_max_ps(ymax, y);
    _mm256_store_ps(sc.s + h * kBlock + j, y);
  }
};

// The block's online softmax for the G query heads of one kv head (state at t0), from the y and
// maxima W7Scores left, ending in w7_weighted_sums' weights: vnni_softmax's passes on 8 lanes,
// with bp the block's largest y, u = round(2^(y - bp + log2(127))) at most 127 and
// wsc = 2^(bp - mn log2(e)) / 127. The heads' maxima and their per-block arithmetic run with the
// heads as lanes (reduce8x8); the weights head by head, packed to bytes four vectors at a time.
// 2^x for x <= log2(127) (or -inf: 0) as the 7-bit weights need it, to within 2.7e-6 (3.4e-4 of
// the top weight's 127: a weight's rounding moves only within that of a half): a degree-4 fit on
// [-1/2, 1/2] (weighted least squares towards equal ripple), the exponent added to the bits;
// below 2^-30 all round to 0.
inline __m256 exp2_w7(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-30.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.009570962f), f, _mm256_set1_ps(0.055917937f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24024723f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931218f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.9999993f));
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)));
}

template <int G>
inline void w7_softmax(Scratch& sc, int64_t t0, int64_t D, int64_t len) {
  const __m256 log2e = _mm256_set1_ps(kLog2e), lowest = _mm256_set1_ps(-INFINITY);
  const __m256 zero = _mm256_setzero_ps();
  const auto vmax = [](__m256 x, __m256 y) { return _mm256_max_ps(x, y); };
  const auto vadd = [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); };
  const int64_t nv = (len + 7) / 8;
  for (int h = G; h < 8; ++h) sc.smax[h] = sc.ymax[h] = lowest;  // past G: nothing seen, nothing here
  alignas(32) float hv[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  for (int h = 0; h < G; ++h) hv[h] = sc.m[t0 + h];
  const __m256 mo = _mm256_load_ps(hv), bv = reduce8x8(sc.smax, vmax), mn = _mm256_max_ps(mo, bv);
  const __m256 before = _mm256_cmp_ps(mo, lowest, _CMP_GT_OQ);  // keys seen before
  const __m256 here = _mm256_cmp_ps(bv, lowest, _CMP_GT_OQ);    // keys visible here
  const __m256 cv = _mm256_and_ps(before, exp2_256(_mm256_mul_ps(_mm256_sub_ps(mo, mn), log2e)));
  alignas(32) float corr[8], bp[8];
  _mm256_store_ps(corr, cv);
  _mm256_store_ps(hv, mn);
  for (int h = 0; h < G; ++h) {
    sc.m[t0 + h] = hv[h];
    if (sc.l[t0 + h] > 0.f && corr[h] != 1.f) scale_row(sc.acc + (t0 + h) * D, D, corr[h]);
  }
  // A head with nothing visible here works on 0 in place of bp and mn: its y stay -inf, its
  // weights 0 and wsc 0, nothing NaN.
  const __m256 bpv = _mm256_and_ps(here, reduce8x8(sc.ymax, vmax));
  _mm256_store_ps(bp, bpv);
  const __m256 wv = _mm256_and_ps(
      here, _mm256_mul_ps(exp2_256(_mm256_fnmadd_ps(_mm256_and_ps(here, mn), log2e, bpv)), _mm256_set1_ps(1.f / kW7Top)));
  _mm256_store_ps(hv, wv);
  for (int h = 0; h < G; ++h) sc.wsc[h] = hv[h];

  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 S[8], zc[8];
  for (int h = 0; h < 8; ++h) S[h] = zc[h] = zero;
  for (int h = 0; h < G; ++h) {  // the weights, their sum and zero-point sum
    const __m256 bo = _mm256_set1_ps(bp[h] - kLog2W7Top);
    const float* y = sc.s + h * kBlock;
    uint8_t* wq = sc.wq + h * kBlock;
    auto weights = [&](int64_t v) {  // vector v's as int32
      // at most 127 (1 + 2.7e-6): rounds to 127 at most, the widest vpmaddubsw takes exactly
      const __m256 u = _mm256_round_ps(exp2_w7(_mm256_sub_ps(_mm256_load_ps(y + 8 * v), bo)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      S[h] = _mm256_fmadd_ps(u, _mm256_load_ps(sc.rv + 8 * v), S[h]);  // the weights as rounded: they and l agree
      zc[h] = _mm256_fmadd_ps(u, _mm256_loadu_ps(sc.vzp + 8 * v), zc[h]);  // integers below 2^24: exact
      return _mm256_cvtps_epi32(u);
    };
    int64_t v = 0;
    for (; v + 4 <= nv; v += 4) {  // 32 weights: words per 128-bit lane, bytes, then in order
      const __m256i a = _mm256_packs_epi32(weights(v), weights(v + 1));
      const __m256i b = _mm256_packs_epi32(weights(v + 2), weights(v + 3));
      _mm256_store_si256(reinterpret_cast<__m256i*>(wq + 8 * v),
                         _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order));
    }
    for (; v < nv; ++v) {
      const __m256i ui = weights(v);
      const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(ui), _mm256_extracti128_si256(ui, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(wq + 8 * v), _mm_packus_epi16(w16, w16));
    }
  }
  const __m256 St = reduce8x8(S, vadd);
  _mm256_store_ps(hv, _mm256_and_ps(here, reduce8x8(zc, vadd)));
  for (int h = 0; h < G; ++h) sc.wzc[h] = static_cast<int32_t>(hv[h]);
  alignas(32) float lo[8] = {};
  for (int h = 0; h < G; ++h) lo[h] = sc.l[t0 + h];
  _mm256_store_ps(lo, _mm256_fmadd_ps(_mm256_load_ps(lo), cv, _mm256_mul_ps(wv, St)));
  for (int h = 0; h < G; ++h) sc.l[t0 + h] = lo[h];
}

// acc += wsc * (sum over the block's value rows of u * (v8 - v_zp)), per head, 8 dims at a
// time: four keys' rows interleaved a byte each into every dword (dims in order), one
// vpmaddubsw and one vpmaddwd per head against the heads' four weights broadcast. Exact in int32
// (at most 64 * 127 * 128 < 2^20). One accumulator per head: with 16 dims at a time G = 7 held
// 14, which AVX2's 16 registers cannot with the operands, and GCC kept most of them on the stack
// (a load and a store per vpaddd).
template <int G, int D>
inline void w7_weighted_sums(Scratch& sc, float* acc0, const int8_t* v, int64_t ss, int64_t len) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int c = 0; c < D / 8; ++c) {
    const int8_t* vr = v + c * 8;
    auto row = [&](int64_t j) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(vr + j * ss)); };
    __m256i o[G];
    for (int h = 0; h < G; ++h) o[h] = _mm256_setzero_si256();
    auto quad = [&](__m128i ra, __m128i rb, __m128i rc, __m128i rd, int64_t j) {
      const __m128i ab = _mm_unpacklo_epi8(ra, rb), cd = _mm_unpacklo_epi8(rc, rd);
      const __m256i x = _mm256_set_m128i(_mm_unpackhi_epi16(ab, cd), _mm_unpacklo_epi16(ab, cd));
      const uint8_t* wb = sc.wq + j;  // the heads' weights at constant offsets from it
      asm("" : "+r"(wb));
      for (int h = 0; h < G; ++h) {
        const __m256i w = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(wb + h * kBlock));
        o[h] = _mm256_add_epi32(o[h], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
      }
    };
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) quad(row(j), row(j + 1), row(j + 2), row(j + 3), j);
    if (j < len) {  // 1-3 rows left: the rest zeros (their weights are 0 too)
      const __m128i z = _mm_setzero_si128();
      quad(row(j), j + 1 < len ? row(j + 1) : z, j + 2 < len ? row(j + 2) : z, z, j);
    }
    for (int h = 0; h < G; ++h) {
      float* acc = acc0 + h * D + c * 8;
      _mm256_store_ps(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(o[h], _mm256_set1_epi32(sc.wzc[h]))),
                                           _mm256_set1_ps(sc.wsc[h]), _mm256_load_ps(acc)));
    }
  }
}
#endif

#if defined(ETS_DECODE_I16)
// w7_weighted_sums over a block's value tile (kv_layout.h: [16 quads of keys][64 dims][4 keys]),
// whose 32 bytes at quad q and dims 8c.. are the interleaved quad the row version builds.
// Past len the tile's bytes are whatever the cache holds there, their weights 0.
template <int G, int D>
inline void w7_weighted_sums_tiled(Scratch& sc, float* acc0, const int8_t* vt, int64_t len) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t nq = (len + 3) / 4;
  for (int c = 0; c < D / 8; ++c) {
    __m256i o[G];
    for (int h = 0; h < G; ++h) o[h] = _mm256_setzero_si256();
    auto quads = [&](int64_t q, int n) {  // n (1 or 2) quads from q into each head's sum
      const uint8_t* wb = sc.wq + 4 * q;
      asm("" : "+r"(wb));  // the heads' weights at constant offsets from it
      const int8_t* x = vt + q * 256 + c * 32;
      for (int h = 0; h < G; ++h) {
        auto one = [&](int k) {
          const __m256i w = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(wb + h * kBlock + 4 * k));
          return _mm256_madd_epi16(
              _mm256_maddubs_epi16(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 256 * k))), ones);
        };
        o[h] = _mm256_add_epi32(o[h], n == 2 ? _mm256_add_epi32(one(0), one(1)) : one(0));
      }
    };
    int64_t q = 0;
    for (; q + 2 <= nq; q += 2) quads(q, 2);  // two a step: half the loop's copies of the sums
    if (q < nq) quads(q, 1);
    for (int h = 0; h < G; ++h) {
      float* acc = acc0 + h * D + c * 8;
      _mm256_store_ps(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(o[h], _mm256_set1_epi32(sc.wzc[h]))),
                                           _mm256_set1_ps(sc.wsc[h]), _mm256_load_ps(acc)));
    }
  }
}

// Block [jb, jb + len) of kv head g (state at t0 = g * G) from tiled caches (kv_layout.h; D 64,
// jb a multiple of 64), its row parameters already in sc: exact int32 scores eight keys at a
// time with no horizontal sums (a key tile's 32 bytes at dim quad dq hold those four dims of
// eight keys: as int16, (d0, d2) and (d1, d3) of each key in a dword, one vpmaddwd each against
// the query's pairs, qt), then w7_softmax and the weighted sums straight from the value tile.
// The next tiles of this head are prefetched as the row version does, kAhead blocks on into L1
// and kFar into L2, eight lines of each a group.
template <int G, int D>
inline void decode_block_tiled(const AttnArgs& a, Scratch& sc, int64_t g, int64_t jb, int64_t len, int64_t jend,
                               const float* mrow) {
  const int64_t t0 = g * G, tile = ((jb >> 6) * a.k.hkv + g) * 4096, next = a.k.hkv * 4096;
  const int8_t* kt = a.k.i8 + tile;
  const int8_t* vt = a.v.i8 + tile;
  const __m256i* qb = sc.qt + t0 * 32;
  asm("" : "+r"(qb));  // the queries at constant offsets from one register
  const W7Scores scores(mrow ? mrow + jb : nullptr, len);
  for (int h = 0; h < G; ++h) sc.smax[h] = sc.ymax[h] = _mm256_set1_ps(-INFINITY);
  const bool near = jend - jb > kAhead * kBlock, far = jend - jb > kFar * kBlock;
  for (int64_t j = 0; j < len; j += 8) {
    for (int64_t x = j * 64; x < j * 64 + 512; x += 64) {
      if (near) {
        _mm_prefetch(reinterpret_cast<const char*>(kt + kAhead * next + x), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(vt + kAhead * next + x), _MM_HINT_T0);
      }
      if (far) {
        _mm_prefetch(reinterpret_cast<const char*>(kt + kFar * next + x), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(vt + kFar * next + x), _MM_HINT_T1);
      }
    }
    const int8_t* kp = kt + (j >> 4) * 1024 + (j & 15) * 4;
    __m256i acc[G];
    for (int h = 0; h < G; ++h) acc[h] = _mm256_setzero_si256();
    for (int dq = 0; dq < 16; ++dq) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp + dq * 64));
      const __m256i even = _mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8), odd = _mm256_srai_epi16(x, 8);
      for (int h = 0; h < G; ++h)
        acc[h] = _mm256_add_epi32(acc[h], _mm256_add_epi32(_mm256_madd_epi16(even, qb[h * 32 + 2 * dq]),
                                                           _mm256_madd_epi16(odd, qb[h * 32 + 2 * dq + 1])));
    }
    // less kz Q' (as the row version), times the scales; lanes past len: -inf there
    const __m256i kz = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc.kzi + j));
    const __m256 ksv = _mm256_loadu_ps(sc.ksc + j);
    for (int h = 0; h < G; ++h) {
      const __m256i dot = _mm256_sub_epi32(acc[h], _mm256_madd_epi16(kz, _mm256_set1_epi32(sc.q8sum[t0 + h] & 0xFFFF)));
      const __m256 sv = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), ksv), _mm256_set1_ps(sc.q8sc[t0 + h]));
      scores.put(sc, h, j, sv, sc.smax[h], sc.ymax[h]);
    }
  }
  w7_softmax<G>(sc, t0, D, len);
  w7_weighted_sums_tiled<G, D>(sc, sc.acc + t0 * D, vt, len);
}

#endif

// Not inlined: the kernel then holds a plain pointer, where an inlined
// thread_local would have it ask for the address again in every loop.
__attribute__((noinline)) Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The lines of n rows of `bytes` bytes, `stride` apart, asked for: one span when they are close.
inline void prefetch_rows(const void* p, int64_t n, int64_t stride, int64_t bytes) {
  const uintptr_t c = reinterpret_cast<uintptr_t>(p);
  auto lines = [](uintptr_t from, uintptr_t to) {
    for (uintptr_t l = from & ~uintptr_t(63); l < to; l += 64) _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
  };
  if (stride <= bytes + 64) {
    lines(c, c + (n - 1) * stride + bytes);
    return;
  }
  for (int64_t r = 0; r < n; ++r) lines(c + r * stride, c + r * stride + bytes);
}

// Block [jb, jb + len) of kv head g for its G query heads (state at t0 = g * G).
template <int G, int D>
inline void decode_block(const AttnArgs& a, Scratch& sc, int64_t b, int64_t g, int64_t jb, int64_t len,
                         int64_t jend, int64_t n_ahead, const float* mrow) {
  using T = Vec::T;
  constexpr int W = Vec::W, NC = D / W;
  const int64_t t0 = g * G;
  const AttnOperand &K = a.k, &V = a.v;
  const int8_t* kd = K.i8 + b * K.sb + g * K.sh;
  const int8_t* vd = V.i8 + b * V.sb + g * V.sh;
  const float* ks = K.scale + b * K.sc_sb + g * K.sc_sh;
  const float* vs = V.scale + b * V.sc_sb + g * V.sc_sh;
  const int8_t* kz = K.zero_point + b * K.zp_sb + g * K.zp_sh;
  const int8_t* vz = V.zero_point + b * V.zp_sb + g * V.zp_sh;

  // The block's row parameters.
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
      // Whole loads where the rows go on past these 16 (the last element read is another
      // head's); masked ones at the end.
      const bool whole = n == 16 && jb + jp + 16 < jend;
      auto gather2 = [&](const float* base) {  // base[0], base[2], ... base[2 (n - 1)]
        const __m512 a = whole ? _mm512_loadu_ps(base) : _mm512_maskz_loadu_ps(lo, base);
        const __m512 b = whole ? _mm512_loadu_ps(base + 16) : _mm512_maskz_loadu_ps(hi, base + 16);
        return _mm512_permutex2var_ps(a, even, b);
      };
      auto zeros2 = [&](const int8_t* base) {  // the same of int8 zero points, as int32
        const __m256i b = whole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base))
                                : _mm256_maskz_loadu_epi8(m8, base);
        return _mm512_srai_epi32(_mm512_slli_epi32(_mm512_cvtepi8_epi16(b), 16), 16);
      };
      _mm512_mask_storeu_ps(sc.ksc + jp, m16, gather2(ks + (jb + jp) * 2));
      _mm512_mask_storeu_ps(sc.vsc + jp, m16, gather2(vs + (jb + jp) * 2));
      const __m512i kzv = zeros2(kz + (jb + jp) * 2), vzv = zeros2(vz + (jb + jp) * 2);
      _mm512_mask_storeu_epi32(sc.kzi + jp, m16, kzv);
      _mm512_mask_storeu_epi32(sc.vzi + jp, m16, vzv);
      _mm512_mask_storeu_ps(sc.kzp + jp, m16, _mm512_cvtepi32_ps(kzv));
#if !defined(ETS_DECODE_VNNI)  // the float weighted sums' correction (VNNI: integer, vzi)
      _mm512_mask_storeu_ps(sc.vzp + jp, m16, _mm512_cvtepi32_ps(vzv));
#endif
    }
  }
#endif
#if defined(ETS_DECODE_I16)
  // Two kv heads (stride 2 in all four): 8 rows' parameters at a time, whole loads where the
  // rows go on past these 8 (the last element read is another head's).
  if (K.sc_ss == 2 && V.sc_ss == 2 && K.zp_ss == 2 && V.zp_ss == 2) {
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m128i even8 = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    auto gather2 = [&](const float* base) {  // base[0], base[2], ... base[14]
      const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(base), even);
      const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(base + 8), even);
      return _mm256_permute2f128_ps(lo, hi, 0x20);
    };
    auto zeros2 = [&](const int8_t* base) {  // the same of int8 zero points, as int32
      return _mm256_cvtepi8_epi32(_mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base)), even8));
    };
    for (; jp + 8 <= len && jb + jp + 8 < jend; jp += 8) {
      _mm256_storeu_ps(sc.ksc + jp, gather2(ks + (jb + jp) * 2));
      _mm256_storeu_ps(sc.vsc + jp, gather2(vs + (jb + jp) * 2));
      const __m256i kzv = zeros2(kz + (jb + jp) * 2);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(sc.kzi + jp), kzv);
      _mm256_storeu_ps(sc.kzp + jp, _mm256_cvtepi32_ps(kzv));  // the float-query path's
      _mm256_storeu_ps(sc.vzp + jp, _mm256_cvtepi32_ps(zeros2(vz + (jb + jp) * 2)));
    }
  }
#endif
  for (int64_t j = jp; j < len; ++j) {
    sc.ksc[j] = ks[(jb + j) * K.sc_ss];
    sc.kzi[j] = kz[(jb + j) * K.zp_ss];
    sc.kzp[j] = static_cast<float>(sc.kzi[j]);
    sc.vsc[j] = vs[(jb + j) * V.sc_ss];
    sc.vzi[j] = vz[(jb + j) * V.zp_ss];
#if !defined(ETS_DECODE_VNNI)  // the float weighted sums' correction, w7_softmax's zero-point sum
    sc.vzp[j] = static_cast<float>(sc.vzi[j]);
#endif
  }

#if defined(ETS_DECODE_I16)
  w7_prepare(sc, len);
  if constexpr (D == 64) {
    if (K.tiled != 0) {
      decode_block_tiled<G, D>(a, sc, g, jb, len, jend, mrow);
      return;
    }
  }
#endif
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
      // The queries' quads at constant offsets from one register: left to itself, GCC hoists
      // all G * D / 4 of their addresses out of this loop and reloads each from the stack.
      const int32_t* qb = sc.q8 + t0 * (D / 4);
      asm("" : "+r"(qb));
      for (int half = 0; half < D / 64; ++half) {
        const int8_t* kr = kd + (jb + c) * K.ss + half * 64;
        __m512i r[16];
        if (cnt == 16) {
#pragma GCC unroll 16
          for (int x = 0; x < 16; ++x) r[x] = _mm512_xor_si512(_mm512_loadu_si512(kr + x * K.ss), flip);
          // this head's rows kAhead blocks on (and kFar, into L2), asked for while the chunk
          // is worked
          for (int64_t x = c; x < std::min<int64_t>(c + 16, n_ahead); ++x)
            _mm_prefetch(reinterpret_cast<const char*>(kr + (kAhead * kBlock + x - c) * K.ss), _MM_HINT_T0);
          for (int64_t x = c; x < std::min<int64_t>(c + 16, jend - jb - kFar * kBlock); ++x)
            _mm_prefetch(reinterpret_cast<const char*>(kr + (kFar * kBlock + x - c) * K.ss), _MM_HINT_T1);
        } else {
          for (int x = 0; x < 16; ++x)
            r[x] = x < cnt ? _mm512_xor_si512(_mm512_loadu_si512(kr + x * K.ss), flip) : _mm512_setzero_si512();
        }
        transpose16(r);
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q) {
          U = dpbusd(U, r[q], ones);
          for (int h = 0; h < G; ++h)
            dots[h] = dpbusd(dots[h], r[q], qb + h * (D / 4) + half * 16 + q);
        }
      }
      const __m512i A = _mm512_add_epi32(_mm512_set1_epi32(128), _mm512_loadu_si512(sc.kzi + c));
      const __m512i B = _mm512_sub_epi32(U, _mm512_mullo_epi32(_mm512_set1_epi32(D), A));
      const __m512 ksv = _mm512_loadu_ps(sc.ksc + c);
      for (int h = 0; h < G; ++h)
        _mm512_store_ps(sc.s + h * kBlock + c,
                        exact_scores16(dots[h], _mm512_set1_epi32(sc.q8sum[t0 + h]), _mm512_set1_epi32(sc.q8zp[t0 + h]),
                                       A, B, ksv, _mm512_set1_ps(sc.q8sc[t0 + h])));
    }
  } else
#endif
#if defined(ETS_DECODE_I16)
  if (a.q.i8 != nullptr) {
    // Exact int32 scores: two key rows at a time as D / 8 vectors of int16 (each 8 dims of the
    // first row, then the same of the second), per head D / 8 vpmaddwd against the query's (less
    // its zero point, each 8 dims twice: q2) and 4 + 4 lanes stored; then eight keys' lanes
    // summed at a time (hadd3), half the reductions of one key a vector.
    constexpr int NK = D / 16;
    const int16_t* qb = sc.q2 + t0 * 2 * D;
    asm("" : "+r"(qb));  // the queries at constant offsets from one register (see the VNNI path)
    const int64_t n_far = std::min(kBlock, jend - jb - kFar * kBlock);
    for (int64_t j = 0; j < len; j += 2) {
      const int8_t* kr = kd + (jb + j) * K.ss;
      const int8_t* kr2 = j + 1 < len ? kr + K.ss : kr;  // an odd block's last row: twice
      const int8_t* vr = vd + (jb + j) * V.ss;
      for (int64_t x = 0; x < 2; ++x) {
        if (j + x < n_ahead)
          for (int o = 0; o < D; o += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(kr + (kAhead * kBlock + x) * K.ss + o), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(vr + (kAhead * kBlock + x) * V.ss + o), _MM_HINT_T0);
          }
        if (j + x < n_far)
          for (int o = 0; o < D; o += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(kr + (kFar * kBlock + x) * K.ss + o), _MM_HINT_T1);
            _mm_prefetch(reinterpret_cast<const char*>(vr + (kFar * kBlock + x) * V.ss + o), _MM_HINT_T1);
          }
      }
      __m256i k16[2 * NK];
      for (int c = 0; c < NK; ++c) {
        const __m128i ra = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + c * 16));
        const __m128i rb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kr2 + c * 16));
        k16[2 * c] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi64(ra, rb));
        k16[2 * c + 1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi64(ra, rb));
      }
      for (int h = 0; h < G; ++h) {
        const __m256i* qh = reinterpret_cast<const __m256i*>(qb + h * 2 * D);
        __m256i x = _mm256_madd_epi16(k16[0], _mm256_load_si256(qh));
        for (int c = 1; c < 2 * NK; ++c) x = _mm256_add_epi32(x, _mm256_madd_epi16(k16[c], _mm256_load_si256(qh + c)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(sc.ipart + (h * kBlock + j) * 4), x);
      }
    }
    // less kz Q' (vpmaddwd: kz's high word is its sign, Q''s zero; |Q'| <= 255 D < 2^15), times
    // the scales
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // hadd3's lanes in key order
    const W7Scores scores(mrow ? mrow + jb : nullptr, len);
    for (int h = 0; h < G; ++h) {
      const __m256i qs = _mm256_set1_epi32(sc.q8sum[t0 + h] & 0xFFFF);
      const __m256 qsc = _mm256_set1_ps(sc.q8sc[t0 + h]);
      scores.head(sc, h, [&](int64_t j) {  // lanes past len: -inf there
        const __m256i sum = _mm256_permutevar8x32_epi32(hadd3(sc.ipart + (h * kBlock + j) * 4), order);
        const __m256i kz = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc.kzi + j));
        const __m256i dot = _mm256_sub_epi32(sum, _mm256_madd_epi16(kz, qs));
        return _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_loadu_ps(sc.ksc + j)), qsc);
      });
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
          _mm_prefetch(reinterpret_cast<const char*>(vd + (jb + kAhead * kBlock + j) * V.ss + o), _MM_HINT_T0);
        }
      }
      T kc[NC];
      for (int c = 0; c < NC; ++c) kc[c] = Vec::cvt(kr + c * W);
      for (int h = 0; h < G; ++h) {
        const float* q = sc.q + (t0 + h) * D;
        T x = Vec::mul(Vec::load(q), kc[0]);
        for (int c = 1; c < NC; ++c) x = Vec::fma(Vec::load(q + c * W), kc[c], x);
        _mm256_store_ps(sc.part + (h * kBlock + j) * 8, Vec::to8(x));
      }
    }
    // Scores: eight keys' sums at a time, less the zero points', times the scales.
    for (int h = 0; h < G; ++h) {
      float* srow = sc.s + h * kBlock;
      const float* p = sc.part + h * kBlock * 8;
      const __m256 qsum = _mm256_set1_ps(sc.qsum[t0 + h]);
      int64_t j = 0;
      for (; j + 8 <= len; j += 8) {
        const float* pj = p + j * 8;
        const __m256 dots = hsum8x8(_mm256_load_ps(pj), _mm256_load_ps(pj + 8), _mm256_load_ps(pj + 16),
                                    _mm256_load_ps(pj + 24), _mm256_load_ps(pj + 32), _mm256_load_ps(pj + 40),
                                    _mm256_load_ps(pj + 48), _mm256_load_ps(pj + 56));
        _mm256_store_ps(srow + j, _mm256_mul_ps(_mm256_load_ps(sc.ksc + j),
                                                _mm256_fnmadd_ps(_mm256_load_ps(sc.kzp + j), qsum, dots)));
      }
      for (; j < len; ++j) srow[j] = sc.ksc[j] * (hsum256(_mm256_load_ps(p + j * 8)) - sc.kzp[j] * sc.qsum[t0 + h]);
    }
#if defined(ETS_DECODE_I16)
    const W7Scores scores(mrow ? mrow + jb : nullptr, len);
    for (int h = 0; h < G; ++h) scores.head(sc, h, [&](int64_t j) { return _mm256_load_ps(sc.s + h * kBlock + j); });
#endif
  }

#if defined(ETS_DECODE_VNNI)
  vnni_softmax<G>(sc, t0, D, len, mrow ? mrow + jb : nullptr);
#elif defined(ETS_DECODE_I16)
  w7_softmax<G>(sc, t0, D, len);
#else
  // Online softmax; the weights times the value scales, and their zero-point correction.
  for (int h = 0; h < G; ++h) {
    const int64_t t = t0 + h;
    float* srow = sc.s + h * kBlock;
    const float bm = add_max(srow, mrow ? mrow + jb : nullptr, len);
    const float mn = std::max(sc.m[t], bm);
    if (!(mn > -INFINITY)) {  // everything so far masked out
      std::fill(srow, srow + len, 0.f);
      sc.zc[h] = 0.f;
      continue;
    }
    const float corr = sc.m[t] > -INFINITY ? std::exp(sc.m[t] - mn) : 0.f;
    if (corr != 1.f) scale_row(sc.acc + t * D, D, corr);
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
    sc.l[t] = sc.l[t] * corr + sum;
    sc.m[t] = mn;
    sc.zc[h] = zc;
  }
#endif
#if defined(ETS_DECODE_VNNI)
  vnni_weighted_sums<G, D>(sc, sc.acc + t0 * D, vd + jb * V.ss, V.ss, len, n_ahead,
                           std::min(kBlock, jend - jb - kFar * kBlock));
#elif defined(ETS_DECODE_I16)
  w7_weighted_sums<G, D>(sc, sc.acc + t0 * D, vd + jb * V.ss, V.ss, len);
#else
  // Weighted sums: a slice of the head dimension at a time, all G heads in registers.
  for (int c = 0; c < NC; ++c) {
    T o[G];
    for (int h = 0; h < G; ++h) o[h] = Vec::load(sc.acc + (t0 + h) * D + c * W);
    const int8_t* vr = vd + jb * V.ss + c * W;
    for (int64_t j = 0; j < len; ++j, vr += V.ss) {
      const T v = Vec::cvt(vr);
      for (int h = 0; h < G; ++h) o[h] = Vec::fma(Vec::bcast(sc.s + h * kBlock + j), v, o[h]);
    }
    for (int h = 0; h < G; ++h) Vec::store(sc.acc + (t0 + h) * D + c * W, Vec::sub(o[h], Vec::set1(sc.zc[h])));
  }
#endif
}

template <int G, int D>
void decode(const AttnArgs& a, int64_t b, int64_t i, int64_t j0, int64_t j1, float* pm, float* pl,
            float* pacc) {
  Scratch& sc = scratch();
  const int64_t H = a.H, Hkv = a.Hkv;

  for (int64_t t = 0; t < H; ++t) {
    float* dst = sc.q + t * D;
    if (a.q.f32 != nullptr) {
      const float* src = a.q.f32 + b * a.q.sb + i * a.q.ss + t * a.q.sh;
      for (int d = 0; d < D; ++d) dst[d] = src[d] * a.scale;
    } else {
      const float qs = a.q.scale[b * a.q.sc_sb + i * a.q.sc_ss + t * a.q.sc_sh];
      const int32_t qz = a.q.zero_point[b * a.q.zp_sb + i * a.q.zp_ss + t * a.q.zp_sh];
      dequant_row(a.q.i8 + b * a.q.sb + i * a.q.ss + t * a.q.sh, D, qs * a.scale, qz, dst);
    }
#if defined(ETS_DECODE_I16)
    if (a.q.i8 != nullptr) {  // q - qz (at most 255 in magnitude) and its sum
      int16_t raw[kMaxD];
      const int32_t sum = raw_query(a, b, i, t, D, raw, sc.q8zp[t], sc.q8sc[t]);
      sc.q8sum[t] = sum - static_cast<int32_t>(D) * sc.q8zp[t];
      if (a.k.tiled == 0) {
        int16_t* q2 = sc.q2 + t * 2 * D;
        for (int d = 0; d < D; ++d)  // dim d of 8-dim chunk c at 16 c + d % 8, and 8 on
          q2[d + (d & ~7)] = q2[d + (d & ~7) + 8] = static_cast<int16_t>(raw[d] - sc.q8zp[t]);
      } else {  // decode_block_tiled's pairs, (q0, q2) and (q1, q3) of each dim quad
        auto pair = [&](int d0, int d1) {
          const uint16_t lo = static_cast<uint16_t>(raw[d0] - sc.q8zp[t]), hi = static_cast<uint16_t>(raw[d1] - sc.q8zp[t]);
          return _mm256_set1_epi32(static_cast<int32_t>(lo | (uint32_t(hi) << 16)));
        };
        for (int dq = 0; dq < D / 4 && dq < 16; ++dq) {
          sc.qt[t * 32 + 2 * dq] = pair(4 * dq, 4 * dq + 2);
          sc.qt[t * 32 + 2 * dq + 1] = pair(4 * dq + 1, 4 * dq + 3);
        }
      }
    }
#endif
#if defined(ETS_DECODE_VNNI)
    if (a.q.i8 != nullptr)
      sc.q8sum[t] = raw_query(a, b, i, t, D, reinterpret_cast<int8_t*>(sc.q8 + t * (D / 4)), sc.q8zp[t], sc.q8sc[t]);
#endif
    float s = 0;
    for (int d = 0; d < D; ++d) s += dst[d];
    sc.qsum[t] = s;
    sc.m[t] = -INFINITY;
    sc.l[t] = 0.f;
    std::fill(sc.acc + t * D, sc.acc + (t + 1) * D, 0.f);
  }

  int64_t lim = a.n_kv;
  if (a.causal) lim = std::min(lim, a.start_pos + i + 1);
  const int64_t jend = std::min(j1, lim);
  const AttnOperand &K = a.k, &V = a.v;
  const float* mrow = a.mask ? a.mask + i * a.mask_ss : nullptr;

  // Block by block, every kv head: the thread reads its key range's rows in order.
  for (int64_t jb = j0; jb < jend; jb += kBlock) {
    const int64_t len = std::min(kBlock, jend - jb);
    const int64_t ahead = jb + kAhead * kBlock;
    const int64_t n_ahead = std::min(kBlock, jend - ahead);
    // The row parameters of every head, kAhead blocks on (a few lines a block).
    if (n_ahead > 0) {
      prefetch_rows(K.scale + b * K.sc_sb + ahead * K.sc_ss, n_ahead, K.sc_ss * 4, (Hkv - 1) * K.sc_sh * 4 + 4);
      prefetch_rows(V.scale + b * V.sc_sb + ahead * V.sc_ss, n_ahead, V.sc_ss * 4, (Hkv - 1) * V.sc_sh * 4 + 4);
      prefetch_rows(K.zero_point + b * K.zp_sb + ahead * K.zp_ss, n_ahead, K.zp_ss, (Hkv - 1) * K.zp_sh + 1);
      prefetch_rows(V.zero_point + b * V.zp_sb + ahead * V.zp_ss, n_ahead, V.zp_ss, (Hkv - 1) * V.zp_sh + 1);
    }
    for (int64_t g = 0; g < Hkv; ++g) decode_block<G, D>(a, sc, b, g, jb, len, jend, n_ahead, mrow);
  }

  for (int64_t t = 0; t < H; ++t) {
    float* acc = sc.acc + t * D;
#if defined(ETS_DECODE_VNNI)
    vnni_unorder<D>(acc);
#endif
    if (pm != nullptr) {
      pm[t] = sc.m[t];
      pl[t] = sc.l[t];
      std::copy(acc, acc + D, pacc + t * D);
      continue;
    }
    float* dst = a.o + b * a.o_sb + i * a.o_ss + t * a.o_sh;
    const float s = sc.l[t] > 0.f ? 1.f / sc.l[t] : 0.f;  // nothing visible: zeros
    for (int d = 0; d < D; ++d) dst[d] = acc[d] * s;
  }
}

using DecodeFn = void (*)(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, float*, float*,
                          float*);

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
  if (a.Hkv <= 0 || a.H % a.Hkv != 0 || a.H > kMaxH) return nullptr;
  const int64_t G = a.H / a.Hkv;
  if (a.D == 64) return pick_g<64>(G);
  if (a.D == 128) return pick_g<128>(G);
  return nullptr;
}

}  // namespace

bool decode_attention_applies(const AttnArgs& a) {
  if (a.k.i8 == nullptr || a.v.i8 == nullptr || pick(a) == nullptr) return false;
  if (a.k.tiled == 0 && a.v.tiled == 0) return true;
#if defined(ETS_DECODE_I16)  // tiled caches: decode_block_tiled, with int8 queries
  return a.D == 64 && a.q.i8 != nullptr && a.k.tiled == static_cast<int>(KvLayout::kKeyTiles) &&
         a.v.tiled == static_cast<int>(KvLayout::kValueTiles) && a.B == 1;
#else
  return false;
#endif
}

bool decode_reads_tiles() {
#if defined(ETS_DECODE_I16)
  return !attention_forced_generic();
#else
  return false;
#endif
}

void attend_decode(const AttnArgs& a, int64_t b, int64_t i, int64_t j0, int64_t j1, float* m, float* l,
                   float* acc) {
  pick(a)(a, b, i, j0, j1, m, l, acc);
}

#elif !defined(ETS_NEON)  // no AVX2 nor NEON (attention_decode_neon.cpp): attention.cpp's generic tile runs these rows

bool decode_attention_applies(const AttnArgs&) { return false; }

bool decode_reads_tiles() { return false; }

void attend_decode(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, float*, float*, float*) {}

#endif

}  // namespace etserve
