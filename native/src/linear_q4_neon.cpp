// etserve::linear_q4 (linear_q4.h) with Advanced SIMD, for the aarch64 kernel sets: the same
// arithmetic as the portable loops of linear_q4.cpp, lane for lane, so that the results are
// bit-identical to them (native/check/kernel_check.cpp checks that).
//
// A weight block's group is 64 bytes, 16 for each of its four rows: byte j of a row holds
// w[j] + 8 in its low nibble and w[j + 16] + 8 in its high one. The nibbles n = w + 8 (0..15)
// enter unsigned against the activations' unsigned bytes u = q + 128 (0..255): the group's
// integer sum D_g = sum w u = sum n u - 8 sum u, exact (sum u per row and group computed once,
// x8). sum n u: with the dot products (dotprod tier, UDOT) two vdotq_u32 a row; without (neon
// tier), widening multiply-accumulates into 16-bit lanes (four products a lane, at most
// 4 * 15 * 255 = 15,300) and one pairwise widening add. Pairwise adds then put the block's four
// rows in the four lanes of one vector, converted once and times the group's four scales
// (float16, vcvt_f32_f16), added to the rows' accumulators: acc += scale * D_g in group order,
// as the portable loop does (no fused multiply-add, like it: ISO C++ does not contract).
// Activation rows go up to four at a time over a block's group, its weights unpacked once for
// them; threads split the blocks.
#include "linear_q4_neon.h"

#if defined(ETS_NEON)

#include "linear_q4.h"

#include <arm_neon.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace etserve {

namespace {

constexpr int64_t kAhead = 2048;  // bytes of the block stream asked for ahead of use

// linear_q4.cpp's quantize_row: per-row asymmetric int8 as torchao does it, stored as q + 128;
// also x8[g] = 8 * (sum of the group's stored bytes). vcvtnq rounds to nearest even as
// std::nearbyint does; the saturating narrows clamp to 0..255.
void quantize_row(const float* x, int64_t K, uint8_t* xu, float* scale_out, int32_t* off_out, int32_t* x8) {
  float32x4_t vlo = vdupq_n_f32(0.f), vhi = vlo;
  int64_t i = 0;
  for (; i + 4 <= K; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    vlo = vminq_f32(vlo, v);
    vhi = vmaxq_f32(vhi, v);
  }
  float lo = vminvq_f32(vlo), hi = vmaxvq_f32(vhi);
  for (; i < K; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  float scale = (hi - lo) / 255.f;
  if (!(scale >= FLT_EPSILON)) scale = FLT_EPSILON;  // also a NaN range
  int32_t zp = -128 - static_cast<int32_t>(std::nearbyint(lo / scale));
  zp = std::min(127, std::max(-128, zp));
  const float inv = 1.f / scale;
  const int32_t off = 128 + zp;
  const float32x4_t vinv = vdupq_n_f32(inv);
  const int32x4_t voff = vdupq_n_s32(off);
  auto q4 = [&](const float* p) { return vaddq_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p), vinv)), voff); };
  for (int64_t g = 0; g < K / kQ4Group; ++g) {  // K is a multiple of 32
    const float* xp = x + g * kQ4Group;
    uint8x16_t b[2];
    for (int h = 0; h < 2; ++h) {
      const int16x8_t a = vcombine_s16(vqmovn_s32(q4(xp + 16 * h)), vqmovn_s32(q4(xp + 16 * h + 4)));
      const int16x8_t c = vcombine_s16(vqmovn_s32(q4(xp + 16 * h + 8)), vqmovn_s32(q4(xp + 16 * h + 12)));
      b[h] = vcombine_u8(vqmovun_s16(a), vqmovun_s16(c));
      vst1q_u8(xu + g * kQ4Group + 16 * h, b[h]);
    }
    x8[g] = 8 * static_cast<int32_t>(vaddlvq_u8(b[0]) + vaddlvq_u8(b[1]));
  }
  *scale_out = scale;
  *off_out = off;
}

// sum over 16 bytes of n_lo * x_lo + n_hi * x_hi in four 32-bit lanes.
inline uint32x4_t dot32(uint8x16_t nl, uint8x16_t nh, uint8x16_t xl, uint8x16_t xh) {
#if defined(ETS_NEON_DOTPROD)
  return vdotq_u32(vdotq_u32(vdupq_n_u32(0), nl, xl), nh, xh);
#else
  uint16x8_t p = vmull_u8(vget_low_u8(nl), vget_low_u8(xl));
  p = vmlal_high_u8(p, nl, xl);
  p = vmlal_u8(p, vget_low_u8(nh), vget_low_u8(xh));
  p = vmlal_high_u8(p, nh, xh);
  return vpaddlq_u16(p);
#endif
}

inline float finish(float acc, float xs, int32_t off, const float* row_sums, const float* bias, int64_t n) {
  float y = xs * (acc - static_cast<float>(off) * row_sums[n]);
  return bias ? y + bias[n] : y;
}

// RM activation rows (xu, row stride K) against weight block blk: rows 4 blk .. 4 blk + 3 of Y.
template <int RM>
void block_rows(const uint8_t* xu, const float* xs, const int32_t* off, const int32_t* x8, int64_t K,
                const uint8_t* W, const uint16_t* S, const float* C, const float* bias, int64_t N, int64_t blk,
                float* Y) {
  const int64_t G = K / kQ4Group;
  const uint8_t* w = W + blk * G * 64;
  const uint16_t* s = S + blk * G * 4;
  const uint8x16_t nib = vdupq_n_u8(0x0F);
  float32x4_t acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < G; ++g, w += 64, s += 4) {
    __builtin_prefetch(w + kAhead);
    uint8x16_t nl[4], nh[4];
    for (int r = 0; r < 4; ++r) {
      const uint8x16_t v = vld1q_u8(w + 16 * r);
      nl[r] = vandq_u8(v, nib);
      nh[r] = vshrq_n_u8(v, 4);
    }
    const float32x4_t sc = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s)));
    for (int m = 0; m < RM; ++m) {
      const uint8_t* xg = xu + m * K + g * kQ4Group;
      const uint8x16_t xl = vld1q_u8(xg), xh = vld1q_u8(xg + 16);
      const uint32x4_t d01 = vpaddq_u32(dot32(nl[0], nh[0], xl, xh), dot32(nl[1], nh[1], xl, xh));
      const uint32x4_t d23 = vpaddq_u32(dot32(nl[2], nh[2], xl, xh), dot32(nl[3], nh[3], xl, xh));
      const int32x4_t d = vsubq_s32(vreinterpretq_s32_u32(vpaddq_u32(d01, d23)), vdupq_n_s32(x8[m * G + g]));
      acc[m] = vaddq_f32(acc[m], vmulq_f32(sc, vcvtq_f32_s32(d)));
    }
  }
  for (int m = 0; m < RM; ++m) {
    float t[4];
    vst1q_f32(t, acc[m]);
    for (int r = 0; r < 4; ++r) Y[m * N + blk * 4 + r] = finish(t[r], xs[m], off[m], C, bias, blk * 4 + r);
  }
}

}  // namespace

void linear_q4_neon(const float* x, int64_t M, int64_t K, const uint8_t* weight, const uint16_t* scales,
                    const float* row_sums, const float* bias, int64_t N, float* out) {
  if (M <= 0 || N <= 0) return;
  const int64_t G = K / kQ4Group;
  thread_local std::vector<uint8_t> xu;
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> off, x8;
  xu.resize(static_cast<size_t>(M * K));
  xs.resize(static_cast<size_t>(M));
  off.resize(static_cast<size_t>(M));
  x8.resize(static_cast<size_t>(M * G));
  uint8_t* XQ = xu.data();
  float* XS = xs.data();
  int32_t* OFF = off.data();
  int32_t* X8 = x8.data();
  if (M == 1) {
    quantize_row(x, K, XQ, XS, OFF, X8);
  } else {
    executorch::extension::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) quantize_row(x + m * K, K, XQ + m * K, XS + m, OFF + m, X8 + m * G);
    });
  }
  executorch::extension::parallel_for(0, N / 4, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      int64_t m = 0;
      for (; m + 4 <= M; m += 4)
        block_rows<4>(XQ + m * K, XS + m, OFF + m, X8 + m * G, K, weight, scales, row_sums, bias, N, blk, out + m * N);
      switch (M - m) {
        case 3:
          block_rows<3>(XQ + m * K, XS + m, OFF + m, X8 + m * G, K, weight, scales, row_sums, bias, N, blk, out + m * N);
          break;
        case 2:
          block_rows<2>(XQ + m * K, XS + m, OFF + m, X8 + m * G, K, weight, scales, row_sums, bias, N, blk, out + m * N);
          break;
        case 1:
          block_rows<1>(XQ + m * K, XS + m, OFF + m, X8 + m * G, K, weight, scales, row_sums, bias, N, blk, out + m * N);
          break;
        default:
          break;
      }
    }
  });
}

}  // namespace etserve

#endif  // ETS_NEON
