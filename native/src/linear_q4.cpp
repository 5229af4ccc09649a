// etserve::linear_q4 (linear_q4.h): 4-bit weights, activations quantized to
// 8 bits per row, integer dot products in 32-wide groups.
//
// AVX2: a group of one weight row is 16 bytes, unpacked to 32 signed bytes
// (nibble - 8) and multiplied with the row's 32 unsigned activation bytes by
// vpmaddubsw (pairs of u8 * s8 into s16: at most 2 * 255 * 8, no saturation),
// vpmaddwd by ones (into 8 int32 sums), converted to float and accumulated
// times the group's scale: the same four instructions per 32 products as
// llama.cpp's Q4_0 x Q8_0 dot. The weights are stored four rows at a time,
// group by group (64 bytes, and four float16 scales), so that decode reads one
// stream per thread, prefetched ahead. One activation row (decode): the four
// rows of a block at a time, each group unpacked in registers. Several rows
// (prefill): panels of 16 output rows unpacked once so that one vector holds
// the same four inputs of 16 rows (gemm_panels: the integer sums stay in the
// lanes for a whole group, one conversion and scale a group for 16 rows; with
// AVX-512 VNNI a 512-bit vpdpbusd); rows past the last whole panel row by row
// as in decode. Every path forms a group's sum as an integer and scales it with
// one fused multiply-add a group, in group order: an output row is the same bit
// for bit however many rows the call has. Threads split the output features (N) by blocks or panels. Where the CPU has
// AMX (linear_q4_amx.h), a panel's rows go 16 at a time through TDPBUSD instead, the panel's
// unpacked weights being its B operand as they are.
// Without AVX2 (and F16C, FMA): the same arithmetic in scalar code; on aarch64 with Advanced SIMD,
// linear_q4_neon.cpp's kernels (bit-identical to the scalar code).
#include "linear_q4.h"
#include "attention_amx.h"  // amx_attention_supported
#include "linear_q4_amx.h"
#include "linear_q4_neon.h"  // ETS_NEON: the aarch64 kernel sets
#include "simd.h"  // dpbusd

// GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -Wmaybe-uninitialized reports where they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <executorch/runtime/kernel/thread_parallel_interface.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define ETS_Q4_AVX2 1
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ETS_Q4_AVX512 1
#endif
#endif

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace etserve {

namespace {

using executorch::runtime::Error;
#if defined(ETS_Q4_AVX512)
using simd::dpbusd;
#endif

// Per-row asymmetric int8 quantization as torchao's choose_qparams_affine and
// quantize_affine do it; stores q + 128 (0..255) and returns scale and 128 + zp.
void quantize_row(const float* x, int64_t K, uint8_t* xu, float* scale_out, int32_t* off_out) {
  float lo = 0.f, hi = 0.f;
  int64_t i = 0;
#if defined(ETS_Q4_AVX2)
  __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps();
  for (; i + 8 <= K; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    vlo = _mm256_min_ps(vlo, v);
    vhi = _mm256_max_ps(vhi, v);
  }
  float tl[8], th[8];
  _mm256_storeu_ps(tl, vlo);
  _mm256_storeu_ps(th, vhi);
  for (int j = 0; j < 8; ++j) lo = std::min(lo, tl[j]), hi = std::max(hi, th[j]);
#endif
  for (; i < K; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  float scale = (hi - lo) / 255.f;
  if (!(scale >= FLT_EPSILON)) scale = FLT_EPSILON;  // also a NaN range
  int32_t zp = -128 - static_cast<int32_t>(std::nearbyint(lo / scale));
  zp = std::min(127, std::max(-128, zp));
  const float inv = 1.f / scale;
  const int32_t off = 128 + zp;
  i = 0;
#if defined(ETS_Q4_AVX2)
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i voff = _mm256_set1_epi32(off);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 32 <= K; i += 32) {
    // cvtps rounds to nearest even, as torch.round; the packs saturate to 0..255
    __m256i a = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv)), voff);
    __m256i b = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv)), voff);
    __m256i c = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vinv)), voff);
    __m256i d = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vinv)), voff);
    const __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xu + i), _mm256_permutevar8x32_epi32(packed, order));
  }
#endif
  for (; i < K; ++i) {
    const int32_t q = static_cast<int32_t>(std::nearbyint(x[i] * inv)) + off;
    xu[i] = static_cast<uint8_t>(std::min(255, std::max(0, q)));
  }
  *scale_out = scale;
  *off_out = off;
}

// p rounded up to a multiple of 64 bytes (buffers allocated 64 bytes long).
template <typename T>
T* align64(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

// One output from its sum over groups: xs * (acc - off * row_sum) (+ bias). Where the panels
// (prefill, rows calls) run, with the same fused steps as their panel_store: every path rounds an
// output alike, so a row's result does not depend on how many rows the call has (a decode step
// and the same token in a batched or speculative rows call agree bit for bit).
// Calls of up to this many rows read the packed weights directly (passes of four rows); wider
// ones go through the panels, whose per-row cost is lower (Qwen, AMX host, loaded: 8 rows 74 ms
// as panels against 108 ms as two gemv passes).
constexpr int64_t kGemvRows = 7;
// The weights a chunk of blocks spans when a call takes more than one pass (five to seven rows):
// every pass runs over a chunk while it is in L2, so the weights come from memory once.
constexpr int64_t kChunkBytes = 96 * 1024;

inline float finish(float acc, float xs, int32_t off, const float* row_sums, const float* bias,
                    int64_t n) {
#if defined(ETS_Q4_AVX2)
  const float y = std::fma(-static_cast<float>(off), row_sums[n], acc);
  return bias ? std::fma(xs, y, bias[n]) : xs * y;
#else
  float y = xs * (acc - static_cast<float>(off) * row_sums[n]);
  return bias ? y + bias[n] : y;
#endif
}

#if defined(ETS_Q4_AVX2)

// 16 packed bytes -> 32 signed bytes (low nibbles first, then high nibbles), minus 8.
inline __m256i unpack_q4(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i b = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_sub_epi8(_mm256_and_si256(b, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

// 32 u8 x s8 products summed in 8 float lanes (each lane: 4 consecutive products). With VNNI,
// one vpdpbusd does what vpmaddubsw + vpmaddwd do.
inline __m256 dot32(__m256i xu, __m256i w) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), xu, w);
#elif defined(__AVXVNNI__)
  const __m256i p = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), xu, w);
#else
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(xu, w), _mm256_set1_epi16(1));
#endif
  return _mm256_cvtepi32_ps(p);
}

// The same 32 products' sum per lane as integers.
inline __m256i dot32i(__m256i xu, __m256i w) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), xu, w);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), xu, w);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(xu, w), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

constexpr int64_t kAhead = 4096;  // bytes of each weight stream fetched ahead of use
// And further on into L2 only (prefetcht1): the weights lie in the .pte's 4 KB pages, where the
// hardware prefetchers stop at every page's end. Qwen's decode at fill 128 on a Zen 5 EPYC whose
// memory was contended (22-27 GB/s numpy copy), old and new alternating in eight rounds: 16.1-18.3
// ms a step without, 11.9-15.1 with it; 16, 32 and 64 KB measured alike (the AVX2 gemv takes
// the same distance, not measured on its own).
constexpr int64_t kFar = 32768;

// The four scales of a block's group (float16 bits) as floats.
inline __m128 scales4(const uint16_t* p) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// R activation rows (decode steps: one; a few in a batched or speculative rows call) against
// weight blocks [b0, b1) (outputs 4 b0 .. 4 b1 - 1): the block's four output rows are one stream
// of 64 bytes a group, read once for the R activation rows. Each row's group sum is formed as an
// integer (exact) and scaled by one fused multiply-add a group, in group order: the panels'
// arithmetic, so that every row's result is theirs bit for bit.
template <int R>
void gemv_rows(const uint8_t* const* xu, const float* xs, const int32_t* off, int64_t K, const uint8_t* W,
               const uint16_t* S, const float* C, const float* bias, int64_t b0, int64_t b1, float* const* y) {
  const int64_t G = K / kQ4Group;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* w = W + blk * G * 64;
    const uint16_t* s = S + blk * G * 4;
    __m128 acc[R];  // lane o: output row o
    for (int r = 0; r < R; ++r) acc[r] = _mm_setzero_ps();
    for (int64_t g = 0; g < G; ++g, w += 64, s += 4) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kFar), _MM_HINT_T1);
      const __m256i w0 = unpack_q4(w), w1 = unpack_q4(w + 16), w2 = unpack_q4(w + 32), w3 = unpack_q4(w + 48);
      const __m128 sc = scales4(s);
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu[r] + g * kQ4Group));
        const __m256i p0 = dot32i(xv, w0), p1 = dot32i(xv, w1), p2 = dot32i(xv, w2), p3 = dot32i(xv, w3);
        // per 128-bit half: [p0, p1, p2, p3] half sums; the halves added: the four outputs' sums
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
        const __m128i d = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(d), sc, acc[r]);
      }
    }
    const int64_t n = blk * 4;
    for (int r = 0; r < R; ++r) {
      alignas(16) float t[4];
      _mm_store_ps(t, acc[r]);
      for (int o = 0; o < 4; ++o) y[r][n + o] = finish(t[o], xs[r], off[r], C, bias, n + o);
    }
  }
}

void gemv(const uint8_t* xu, float xs, int32_t off, int64_t K, const uint8_t* W, const uint16_t* S,
          const float* C, const float* bias, int64_t b0, int64_t b1, float* y) {
  gemv_rows<1>(&xu, &xs, &off, K, W, S, C, bias, b0, b1, &y);
}

#if defined(ETS_Q4_AVX512)
// Decode with AVX-512 VNNI: a block's group (64 bytes, four rows of 16) is one vector; its low
// nibbles are inputs 0..15 of the four rows, its high nibbles inputs 16..31, so two vpdpbusd
// against the group's activations repeated four times (xq: per group, inputs 0..15 x4 then
// 16..31 x4) give each row's products in its four lanes. The nibbles enter unsigned (0..15):
// the integer sums start from -8 * (the group's activation sum) in one lane per row (x8: per
// group, 16 lanes). One conversion and scale a group for the four rows.
template <int R>
void gemv512_rows(const uint8_t* const* xq, const int32_t* const* x8, const float* xs, const int32_t* off,
                  int64_t K, const uint8_t* W, const uint16_t* S, const float* C, const float* bias, int64_t b0,
                  int64_t b1, float* const* y) {
  const int64_t G = K / kQ4Group;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* w = W + blk * G * 64;
    const uint16_t* s = S + blk * G * 4;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g, w += 64, s += 4) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kFar), _MM_HINT_T1);
      const __m512i wv = _mm512_loadu_si512(w);
      const __m512i lo = _mm512_and_si512(wv, nib), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
      const __m512 sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales4(s)));
      for (int r = 0; r < R; ++r) {
        __m512i d = _mm512_load_si512(x8[r] + g * 16);
        d = dpbusd(d, _mm512_load_si512(xq[r] + g * 128), lo);
        d = dpbusd(d, _mm512_load_si512(xq[r] + g * 128 + 64), hi);
        // the four lanes of an output (one 128-bit lane) summed as integers: each holds the
        // output's group sum, scaled once a group like the panels do (their result, bit for bit)
        d = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, _MM_PERM_BADC));
        d = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, _MM_PERM_CDAB));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[r]);
      }
    }
    // lanes 4o..4o+3 each hold output o's sum
    const int64_t n = blk * 4;
    for (int r = 0; r < R; ++r) {
      alignas(64) float t[16];
      _mm512_store_ps(t, acc[r]);
      for (int o = 0; o < 4; ++o) y[r][n + o] = finish(t[4 * o], xs[r], off[r], C, bias, n + o);
    }
  }
}

// Four activation rows at once: the same integers as gemv512_rows, the four rows' lanes summed
// together (two rounds of unpack and add give lane 4o + r the sum of output o for row r), then
// one conversion and one fused multiply-add a group for the four rows.
void gemv512_rows4(const uint8_t* const* xq, const int32_t* const* x8, const float* xs, const int32_t* off,
                   int64_t K, const uint8_t* W, const uint16_t* S, const float* C, const float* bias, int64_t b0,
                   int64_t b1, float* const* y) {
  const int64_t G = K / kQ4Group;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* w = W + blk * G * 64;
    const uint16_t* s = S + blk * G * 4;
    __m512 acc = _mm512_setzero_ps();  // lane 4o + r: output o of row r
    for (int64_t g = 0; g < G; ++g, w += 64, s += 4) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kFar), _MM_HINT_T1);
      const __m512i wv = _mm512_loadu_si512(w);
      const __m512i lo = _mm512_and_si512(wv, nib), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
      __m512i d[4];
      for (int r = 0; r < 4; ++r) {
        d[r] = _mm512_load_si512(x8[r] + g * 16);
        d[r] = dpbusd(d[r], _mm512_load_si512(xq[r] + g * 128), lo);
        d[r] = dpbusd(d[r], _mm512_load_si512(xq[r] + g * 128 + 64), hi);
      }
      // per 128-bit lane (an output): d[r] = [r0 r1 r2 r3] partial sums
      const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(d[0], d[1]), _mm512_unpackhi_epi32(d[0], d[1]));
      const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2], d[3]), _mm512_unpackhi_epi32(d[2], d[3]));
      const __m512i sum = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
      const __m512 sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales4(s)));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, acc);
    }
    alignas(64) float t[16];
    _mm512_store_ps(t, acc);
    const int64_t n = blk * 4;
    for (int r = 0; r < 4; ++r)
      for (int o = 0; o < 4; ++o) y[r][n + o] = finish(t[4 * o + r], xs[r], off[r], C, bias, n + o);
  }
}

// gemv512's activation layout for one row: xq (G * 128 bytes) and x8 (G * 16 int32).
void gemv512_prepare(const uint8_t* xu, int64_t K, uint8_t* xq, int32_t* x8) {
  const int64_t G = K / kQ4Group;
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* x = xu + g * kQ4Group;
    int32_t sum = 0;
    for (int k = 0; k < kQ4Group; ++k) sum += x[k];
    for (int r = 0; r < 4; ++r) {
      std::memcpy(xq + g * 128 + r * 16, x, 16);
      std::memcpy(xq + g * 128 + 64 + r * 16, x + 16, 16);
      for (int l = 0; l < 4; ++l) x8[g * 16 + r * 4 + l] = l == 0 ? -8 * sum : 0;
    }
  }
}
#endif

// Prefill by panels of 16 output rows (four blocks): the panel's weights unpacked once into
// `pw` as [group][quad of inputs][16 rows][4 bytes], its scales into `ps` as [group][16 rows],
// so that one vector holds the same four inputs of 16 rows: multiplied with four activation
// bytes broadcast, every lane adds to its own row's sum, a group's eight quads add up in the
// lanes and the float conversion and scale come once a group (not once per 32 products as in
// a gemv). Eight activation rows at a time (AVX-512), then four, then one.
constexpr int64_t kPanel = 16;

void unpack_panel(const uint8_t* W, const uint16_t* S, int64_t G, int64_t blk0, int8_t* pw, float* ps) {
#if defined(ETS_Q4_AVX512)
  // A group of the panel's four blocks is four vectors, block b's rows r holding the quads of
  // inputs q (low nibbles; high nibbles: quads 4 + q) as dwords 4r + q. Each is reordered to
  // dwords 4q + r, so that 128-bit lane q holds quad q of its four rows; the lanes of the four
  // blocks transposed (4 x 4 of 128-bit lanes) then give, per quad, the 16 rows in order.
  const __m512i qr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  const int64_t gs = G * 64;  // bytes from one block to the next
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* src = W + (blk0 * G + g) * 64;
    __m512i lo[4], hi[4];
    for (int b = 0; b < 4; ++b) {
      const __m512i v = _mm512_loadu_si512(src + b * gs);
      lo[b] = _mm512_permutexvar_epi32(qr, _mm512_sub_epi8(_mm512_and_si512(v, low), eight));
      hi[b] = _mm512_permutexvar_epi32(qr, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight));
    }
    int8_t* dst = pw + g * 8 * kPanel * 4;
    auto transpose = [&](const __m512i x[4], int8_t* out) {  // out: quads 0-3 of 16 rows
      const __m512i t0 = _mm512_shuffle_i32x4(x[0], x[1], 0x44), t1 = _mm512_shuffle_i32x4(x[0], x[1], 0xEE);
      const __m512i t2 = _mm512_shuffle_i32x4(x[2], x[3], 0x44), t3 = _mm512_shuffle_i32x4(x[2], x[3], 0xEE);
      _mm512_store_si512(out, _mm512_shuffle_i32x4(t0, t2, 0x88));
      _mm512_store_si512(out + 64, _mm512_shuffle_i32x4(t0, t2, 0xDD));
      _mm512_store_si512(out + 128, _mm512_shuffle_i32x4(t1, t3, 0x88));
      _mm512_store_si512(out + 192, _mm512_shuffle_i32x4(t1, t3, 0xDD));
    };
    transpose(lo, dst);
    transpose(hi, dst + 256);
    alignas(32) uint16_t h[16];  // the four blocks' four scales
    for (int b = 0; b < 4; ++b) std::memcpy(h + 4 * b, S + ((blk0 + b) * G + g) * 4, 8);
    _mm512_store_ps(ps + g * kPanel, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))));
  }
#else
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t bi = 0; bi < kPanel / 4; ++bi) {
      const int64_t blk = blk0 + bi;
      float t[4];
      _mm_storeu_ps(t, scales4(S + (blk * G + g) * 4));
      for (int r = 0; r < 4; ++r) {
        alignas(32) int32_t q[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(q), unpack_q4(W + (blk * G + g) * 64 + r * 16));
        const int64_t row = bi * 4 + r;
        int32_t* dst = reinterpret_cast<int32_t*>(pw) + g * 8 * kPanel + row;
        for (int k = 0; k < 8; ++k) dst[k * kPanel] = q[k];
        ps[g * kPanel + row] = t[r];
      }
    }
  }
#endif
}

// Four activation bytes (one quad) as every 32-bit lane.
inline int32_t quad(const uint8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}

#if defined(ETS_Q4_AVX512)
// RM activation rows against a panel: out[r][16] = sum over groups of scale * integer dot.
template <int RM>
void panel_rows(const uint8_t* x0, int64_t K, const int8_t* pw, const float* ps, __m512 out[RM]) {
  const int64_t G = K / kQ4Group;
  for (int r = 0; r < RM; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[RM];
    for (int r = 0; r < RM; ++r) acc[r] = _mm512_setzero_si512();
    const uint8_t* xg = x0 + g * kQ4Group;
    const int8_t* wg = pw + g * 8 * kPanel * 4;
    for (int k = 0; k < 8; ++k) {
      const __m512i w = _mm512_load_si512(wg + k * kPanel * 4);
      for (int r = 0; r < RM; ++r)
        acc[r] = dpbusd(acc[r], _mm512_set1_epi32(quad(xg + r * K + 4 * k)), w);
    }
    const __m512 sc = _mm512_load_ps(ps + g * kPanel);
    for (int r = 0; r < RM; ++r) out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), sc, out[r]);
  }
}

template <int RM>
void panel_store(const __m512 out[RM], const float* xs, const int32_t* off, const float* C,
                 const float* bias, int64_t n0, int64_t N, float* Y) {
  const __m512 rs = _mm512_loadu_ps(C + n0);
  for (int r = 0; r < RM; ++r) {
    const __m512 t = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(off[r])), rs, out[r]);
    const __m512 y = bias ? _mm512_fmadd_ps(_mm512_set1_ps(xs[r]), t, _mm512_loadu_ps(bias + n0))
                          : _mm512_mul_ps(_mm512_set1_ps(xs[r]), t);  // as finish() rounds
    _mm512_storeu_ps(Y + r * N + n0, y);
  }
}
#else
// The same with 256-bit vectors: a panel is two halves of 8 rows. Without VNNI a quad's
// products come in pairs (vpmaddubsw: at most 2 * 255 * 8 = 4,080) and a group's eight quads
// add up in 16 bits (at most 32,640) before one vpmaddwd widens them.
inline __m256i quad_dot(__m256i acc16, __m256i x, __m256i w) {
  return _mm256_add_epi16(acc16, _mm256_maddubs_epi16(x, w));
}

template <int RM>
void panel_rows(const uint8_t* x0, int64_t K, const int8_t* pw, const float* ps, __m256 out[RM][2]) {
  const int64_t G = K / kQ4Group;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < RM; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i acc[RM][2];
    for (int r = 0; r < RM; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const uint8_t* xg = x0 + g * kQ4Group;
    const int8_t* wg = pw + g * 8 * kPanel * 4;
    for (int k = 0; k < 8; ++k) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg + k * kPanel * 4));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg + k * kPanel * 4 + 32));
      for (int r = 0; r < RM; ++r) {
        const __m256i x = _mm256_set1_epi32(quad(xg + r * K + 4 * k));
        acc[r][0] = quad_dot(acc[r][0], x, w0);
        acc[r][1] = quad_dot(acc[r][1], x, w1);
      }
    }
    const __m256 s0 = _mm256_load_ps(ps + g * kPanel), s1 = _mm256_load_ps(ps + g * kPanel + 8);
    for (int r = 0; r < RM; ++r) {
      out[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r][0], ones)), s0, out[r][0]);
      out[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r][1], ones)), s1, out[r][1]);
    }
  }
}

template <int RM>
void panel_store(const __m256 out[RM][2], const float* xs, const int32_t* off, const float* C,
                 const float* bias, int64_t n0, int64_t N, float* Y) {
  for (int h = 0; h < 2; ++h) {
    const __m256 rs = _mm256_loadu_ps(C + n0 + 8 * h);
    for (int r = 0; r < RM; ++r) {
      const __m256 t = _mm256_fnmadd_ps(_mm256_set1_ps(static_cast<float>(off[r])), rs, out[r][h]);
      const __m256 y = bias ? _mm256_fmadd_ps(_mm256_set1_ps(xs[r]), t, _mm256_loadu_ps(bias + n0 + 8 * h))
                            : _mm256_mul_ps(_mm256_set1_ps(xs[r]), t);  // as finish() rounds
      _mm256_storeu_ps(Y + r * N + n0 + 8 * h, y);
    }
  }
}
#endif

// Activation rows [0, M) against panels [p0, p1) (output rows 16 p0 .. 16 p1 - 1).
void gemm_panels(const uint8_t* XU, const float* xs, const int32_t* off, int64_t M, int64_t K,
                 const uint8_t* W, const uint16_t* S, const float* C, const float* bias, int64_t N,
                 int64_t p0, int64_t p1, float* Y, int8_t* pw, float* ps, float* sums) {
  const int64_t G = K / kQ4Group;
#if defined(ETS_Q4_AVX512)
  using Out = __m512;
  const int64_t M16 = sums != nullptr ? M / 16 * 16 : 0;  // rows on AMX tiles
#else
  using Out = __m256[2];
#endif
  for (int64_t p = p0; p < p1; ++p) {
    unpack_panel(W, S, G, p * (kPanel / 4), pw, ps);
    const int64_t n0 = p * kPanel;
    int64_t m = 0;
#if defined(ETS_Q4_AVX512)
    if (M16 > 0) {
      q4_panel_amx(XU, M16, K, pw, ps, sums);
      for (; m < M16; m += 8) {
        Out out[8];
        for (int r = 0; r < 8; ++r) out[r] = _mm512_load_ps(sums + (m + r) * kPanel);
        panel_store<8>(out, xs + m, off + m, C, bias, n0, N, Y + m * N);
      }
    }
    // Eight rows where they are (eight chains of vpdpbusd, their latency hidden: 1.6 times
    // four rows' speed on a Zen 5 EPYC; twelve spill)
    for (; m + 8 <= M; m += 8) {
      Out out[8];
      panel_rows<8>(XU + m * K, K, pw, ps, out);
      panel_store<8>(out, xs + m, off + m, C, bias, n0, N, Y + m * N);
    }
#endif
    for (; m + 4 <= M; m += 4) {
      Out out[4];
      panel_rows<4>(XU + m * K, K, pw, ps, out);
      panel_store<4>(out, xs + m, off + m, C, bias, n0, N, Y + m * N);
    }
    for (; m < M; ++m) {
      Out out[1];
      panel_rows<1>(XU + m * K, K, pw, ps, out);
      panel_store<1>(out, xs + m, off + m, C, bias, n0, N, Y + m * N);
    }
  }
}

#else  // !ETS_Q4_AVX2

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
  return sign ? -v : v;
}

void gemv(const uint8_t* xu, float xs, int32_t off, int64_t K, const uint8_t* W, const uint16_t* S,
          const float* C, const float* bias, int64_t b0, int64_t b1, float* y) {
  const int64_t G = K / kQ4Group;
  for (int64_t blk = b0; blk < b1; ++blk) {
    for (int r = 0; r < 4; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = W + (blk * G + g) * 64 + r * 16;
        const uint8_t* x = xu + g * kQ4Group;
        int32_t d = 0;
        for (int j = 0; j < 16; ++j) {
          d += (static_cast<int32_t>(p[j] & 0x0F) - 8) * x[j];
          d += (static_cast<int32_t>(p[j] >> 4) - 8) * x[j + 16];
        }
        acc += half_to_float(S[(blk * G + g) * 4 + r]) * static_cast<float>(d);
      }
      y[blk * 4 + r] = finish(acc, xs, off, C, bias, blk * 4 + r);
    }
  }
}


#endif

bool contiguous(const Tensor& t) {
  const auto st = t.strides();
  const auto sz = t.sizes();
  int64_t expect = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (sz[d] != 1 && st[d] != expect) return false;
    expect *= sz[d];
  }
  return true;
}

}  // namespace

bool linear_q4_amx_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("ETSERVE_LINEAR");
    return amx_attention_supported() && !(env && std::strcmp(env, "generic") == 0);
  }();
  return on;
}

void linear_q4(const float* x, int64_t M, int64_t K, const uint8_t* weight, const uint16_t* scales,
               const float* row_sums, const float* bias, int64_t N, float* out) {
  if (M <= 0 || N <= 0) return;
#if defined(ETS_NEON)
  linear_q4_neon(x, M, K, weight, scales, row_sums, bias, N, out);
  return;
#endif
  thread_local std::vector<uint8_t> xu;
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> off;
  xu.resize(static_cast<size_t>(M * K));
  xs.resize(static_cast<size_t>(M));
  off.resize(static_cast<size_t>(M));
  if (M == 1) {
    quantize_row(x, K, xu.data(), &xs[0], &off[0]);
  } else {  // a prefill chunk's rows: a few hundred microseconds on one thread for 4,864 inputs
    uint8_t* XQ = xu.data();
    float* S = xs.data();
    int32_t* O = off.data();
    executorch::extension::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) quantize_row(x + m * K, K, XQ + m * K, &S[m], &O[m]);
    });
  }

  const uint8_t* XU = xu.data();
  const float* XS = xs.data();
  const int32_t* OFF = off.data();
  const int64_t blocks = N / 4;
  if (M <= kGemvRows) {  // decode steps, rows calls: the weights read once for every row
    float* ys[kGemvRows];
    for (int64_t m = 0; m < M; ++m) ys[m] = out + m * N;
    // Rows past the first four take further passes over the weights: chunks of blocks small
    // enough to stay in L2 between the passes, so the weights come from memory once.
    [[maybe_unused]] const int64_t chunk = M <= 4 ? blocks : std::max<int64_t>(1, kChunkBytes / (K / kQ4Group * 64));
#if defined(ETS_Q4_AVX512)
    const int64_t G = K / kQ4Group;
    thread_local std::vector<int32_t> xbuf;  // per row: xq then x8, 64-byte aligned
    const int64_t per_row = G * 32 + G * 16;
    xbuf.resize(static_cast<size_t>(M * per_row + 16));
    int32_t* base = align64(xbuf.data());
    const uint8_t* xq[kGemvRows];
    const int32_t* x8[kGemvRows];
    for (int64_t m = 0; m < M; ++m) {
      uint8_t* q = reinterpret_cast<uint8_t*>(base + m * per_row);
      int32_t* e = base + m * per_row + G * 32;
      gemv512_prepare(XU + m * K, K, q, e);
      xq[m] = q;
      x8[m] = e;
    }
    executorch::extension::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t c0 = b0; c0 < b1; c0 += chunk) {  // every pass over a chunk while it is in L2
        const int64_t c1 = std::min(b1, c0 + chunk);
        for (int64_t m = 0; m < M; m += 4) {  // four rows a pass (registers)
          switch (std::min<int64_t>(4, M - m)) {
            case 1: gemv512_rows<1>(xq + m, x8 + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m); break;
            case 2: gemv512_rows<2>(xq + m, x8 + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m); break;
            case 3: gemv512_rows<3>(xq + m, x8 + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m); break;
            default: gemv512_rows4(xq + m, x8 + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m);
          }
        }
      }
    });
#elif defined(ETS_Q4_AVX2)
    const uint8_t* xr[kGemvRows];
    for (int64_t m = 0; m < M; ++m) xr[m] = XU + m * K;
    executorch::extension::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t c0 = b0; c0 < b1; c0 += chunk) {
        const int64_t c1 = std::min(b1, c0 + chunk);
        for (int64_t m = 0; m < M; m += 4) {
          switch (std::min<int64_t>(4, M - m)) {
            case 1: gemv_rows<1>(xr + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m); break;
            case 2: gemv_rows<2>(xr + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m); break;
            case 3: gemv_rows<3>(xr + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m); break;
            default: gemv_rows<4>(xr + m, XS + m, OFF + m, K, weight, scales, row_sums, bias, c0, c1, ys + m);
          }
        }
      }
    });
#else
    executorch::extension::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t m = 0; m < M; ++m) gemv(XU + m * K, XS[m], OFF[m], K, weight, scales, row_sums, bias, b0, b1, ys[m]);
    });
#endif
    return;
  }
  int64_t done = 0;  // blocks computed by panels
#if defined(ETS_Q4_AVX2)
  const int64_t panels = N / kPanel;
  if (panels > 0) {
#if defined(ETS_Q4_AVX512)
    const bool amx = M >= 16 && linear_q4_amx_enabled();
#else
    const bool amx = false;
#endif
    executorch::extension::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      thread_local std::vector<int8_t> pw;
      thread_local std::vector<float> ps, sums;
      pw.resize(static_cast<size_t>(K / kQ4Group * 8 * kPanel * 4 + 64));
      ps.resize(static_cast<size_t>(K / kQ4Group * kPanel + 16));
      if (amx) sums.resize(static_cast<size_t>(M / 16 * 16 * kPanel + 16));
      gemm_panels(XU, XS, OFF, M, K, weight, scales, row_sums, bias, N, p0, p1, out, align64(pw.data()),
                  align64(ps.data()), amx ? align64(sums.data()) : nullptr);
    });
    done = panels * (kPanel / 4);
  }
#endif
  if (done == blocks) return;
  // Blocks past the last whole panel: each row as a decode step computes them (the same rounding)
  executorch::extension::parallel_for(done, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t m = 0; m < M; ++m) gemv(XU + m * K, XS[m], OFF[m], K, weight, scales, row_sums, bias, b0, b1,
                                         out + m * N);
  });
}

Tensor& linear_q4_out(KernelRuntimeContext& ctx, const Tensor& input, const Tensor& weight,
                      const Tensor& scales, const Tensor& row_sums,
                      const std::optional<Tensor>& bias, Tensor& out) {
  using executorch::aten::ScalarType;
  const char* op = "etserve::linear_q4.out";
  ET_KERNEL_CHECK_MSG(ctx, input.scalar_type() == ScalarType::Float && input.dim() >= 1,
                      InvalidArgument, out, "%s: input must be a float tensor", op);
  const int64_t K = input.size(input.dim() - 1);
  ET_KERNEL_CHECK_MSG(ctx, K > 0 && K % kQ4Group == 0, InvalidArgument, out,
                      "%s: input features (%lld) must be a multiple of %lld", op, (long long)K,
                      (long long)kQ4Group);
  ET_KERNEL_CHECK_MSG(ctx, weight.scalar_type() == ScalarType::Byte && weight.dim() == 2 &&
                               weight.size(1) == K / 2,
                      InvalidArgument, out, "%s: weight must be uint8 [N, %lld]", op,
                      (long long)(K / 2));
  const int64_t N = weight.size(0);
  ET_KERNEL_CHECK_MSG(ctx, N % 4 == 0, InvalidArgument, out,
                      "%s: output features (%lld) must be a multiple of 4", op, (long long)N);
  ET_KERNEL_CHECK_MSG(ctx, scales.scalar_type() == ScalarType::Short && scales.dim() == 2 &&
                               scales.size(0) == N && scales.size(1) == K / kQ4Group,
                      InvalidArgument, out, "%s: scales must be int16 (float16 bits) [%lld, %lld]",
                      op, (long long)N, (long long)(K / kQ4Group));
  ET_KERNEL_CHECK_MSG(ctx, row_sums.scalar_type() == ScalarType::Float && row_sums.numel() == N,
                      InvalidArgument, out, "%s: row_sums must be float [%lld]", op, (long long)N);
  ET_KERNEL_CHECK_MSG(ctx, !bias || (bias->scalar_type() == ScalarType::Float && bias->numel() == N),
                      InvalidArgument, out, "%s: bias must be float [%lld]", op, (long long)N);
  ET_KERNEL_CHECK_MSG(ctx, out.scalar_type() == ScalarType::Float, InvalidArgument, out,
                      "%s: out must be float", op);
  ET_KERNEL_CHECK_MSG(ctx, contiguous(input) && contiguous(weight) && contiguous(scales) &&
                               contiguous(row_sums) && (!bias || contiguous(*bias)),
                      InvalidArgument, out, "%s: operands must be contiguous", op);

  executorch::aten::SizesType sizes[executorch::runtime::kTensorDimensionLimit];
  for (int64_t d = 0; d < input.dim(); ++d) sizes[d] = input.size(d);
  sizes[input.dim() - 1] = static_cast<executorch::aten::SizesType>(N);
  ET_KERNEL_CHECK_MSG(
      ctx,
      executorch::runtime::resize_tensor(
          out, {sizes, static_cast<size_t>(input.dim())}) == Error::Ok,
      InvalidArgument, out, "%s: cannot resize out", op);
  ET_KERNEL_CHECK_MSG(ctx, contiguous(out), InvalidArgument, out, "%s: out must be contiguous", op);

  const int64_t M = K ? input.numel() / K : 0;
  linear_q4(input.const_data_ptr<float>(), M, K, weight.const_data_ptr<uint8_t>(),
            reinterpret_cast<const uint16_t*>(scales.const_data_ptr<int16_t>()), row_sums.const_data_ptr<float>(),
            bias ? bias->const_data_ptr<float>() : nullptr, N, out.mutable_data_ptr<float>());
  return out;
}

}  // namespace etserve
