// One-query-row attention over int8 KV caches (attention_decode.h) with Advanced SIMD, for the
// aarch64 kernel sets, as the AVX2 kernel (attention_decode.cpp) in 128-bit vectors. Every query
// head that shares a kv head walks a 64-key block together. Scores of int8 queries are exact:
// integer dot products of the raw rows (SDOT on the dotprod tier, widening multiplies on the
// plain NEON one), the zero points subtracted in int32; float queries are dotted with each key
// row converted to floats in registers, the zero point folded in through the query's sum. Then
// an online softmax per head with a Cephes-style exp, and the weights p * v_scale against the
// value rows converted in registers (8 dims at a time, all G heads' sums in registers), less one
// correction per block and head, sum(p * v_scale * v_zp). Rows kAhead blocks on are prefetched
// while a block is worked.
#include "attention_decode.h"
#include "isa.h"

#if defined(ETS_NEON)

#include "simd.h"  // simd_neon.h: exp4, add_max

#include <arm_neon.h>

#include <algorithm>
#include <cmath>

namespace etserve {

namespace {

using simd::neon::add_max;
using simd::neon::dot16;
using simd::neon::exp4;
using simd::neon::hsum4x4;

constexpr int64_t kBlock = 64;  // keys per block: its scores stay in L1
constexpr int64_t kAhead = 2;   // blocks between the rows prefetched and the rows worked
constexpr int kMaxG = 8, kMaxD = 128, kMaxH = 64;

struct alignas(64) Scratch {
  float q[kMaxH * kMaxD];    // queries, dequantized and times the softmax scale
  float acc[kMaxH * kMaxD];  // unnormalized weighted sums
  float qsum[kMaxH], m[kMaxH], l[kMaxH];
  float s[kMaxG * kBlock];  // one kv head's block: scores, then weights
  float ksc[kBlock], kzp[kBlock], vsc[kBlock], vzp[kBlock];
  float zc[kMaxG];
  // exact scores (int8 queries): the raw queries, their sums, zero points and scales (times the
  // softmax scale); the block's key zero points; per head and key 4 lanes of an int32 dot
  // product (head G: the key's own sum)
  int8_t q8[kMaxH * kMaxD];
  int32_t q8sum[kMaxH], q8zp[kMaxH];
  float q8sc[kMaxH];
  int32_t kzi[kBlock];
  int32_t ipart[(kMaxG + 1) * kBlock * 4];
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// 16 int8 -> four vectors of 4 floats.
inline void cvt16(const int8_t* p, float32x4_t f[4]) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
  f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
  f[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
  f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
  f[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

// Block [jb, jb + len) of kv head g for its G query heads (state at t0 = g * G).
template <int G, int D>
inline void decode_block(const AttnArgs& a, Scratch& sc, int64_t b, int64_t g, int64_t jb, int64_t len,
                         int64_t n_ahead, const float* mrow) {
  const int64_t t0 = g * G;
  const AttnOperand &K = a.k, &V = a.v;
  const int8_t* kd = K.i8 + b * K.sb + g * K.sh;
  const int8_t* vd = V.i8 + b * V.sb + g * V.sh;
  const float* ks = K.scale + b * K.sc_sb + g * K.sc_sh;
  const float* vs = V.scale + b * V.sc_sb + g * V.sc_sh;
  const int8_t* kz = K.zero_point + b * K.zp_sb + g * K.zp_sh;
  const int8_t* vz = V.zero_point + b * V.zp_sb + g * V.zp_sh;
  for (int64_t j = 0; j < len; ++j) {
    sc.ksc[j] = ks[(jb + j) * K.sc_ss];
    sc.kzp[j] = static_cast<float>(kz[(jb + j) * K.zp_ss]);
    sc.vsc[j] = vs[(jb + j) * V.sc_ss];
    sc.vzp[j] = static_cast<float>(vz[(jb + j) * V.zp_ss]);
    sc.kzi[j] = kz[(jb + j) * K.zp_ss];
  }
  // key row j's and value row j's lines kAhead blocks on, asked for while row j is worked
  auto ahead = [&](int64_t j) {
    if (j >= n_ahead) return;
    for (int o = 0; o < D; o += 64) {
      __builtin_prefetch(kd + (jb + kAhead * kBlock + j) * K.ss + o);
      __builtin_prefetch(vd + (jb + kAhead * kBlock + j) * V.ss + o);
    }
  };

  if (a.q.i8 != nullptr) {
    // Exact int32 scores (dot16: SDOT on the dotprod tier, widening multiplies otherwise): per
    // key row D / 16 of them per head against the raw query, and its own sum; then, as the AVX2 kernel,
    // sum (q - qz)(k - kz) = dot - kz Q - qz (K - D kz) (at most 255 * 255 * D < 2^24: exact
    // as a float), four keys' lanes summed at a time.
    constexpr int NK = D / 16;
    const int8x16_t ones = vdupq_n_s8(1);
    const int8_t* qb = sc.q8 + t0 * D;
    for (int64_t j = 0; j < len; ++j) {
      const int8_t* kr = kd + (jb + j) * K.ss;
      ahead(j);
      int8x16_t k[NK];
      for (int c = 0; c < NK; ++c) k[c] = vld1q_s8(kr + 16 * c);
      int32x4_t ksum = vdupq_n_s32(0);
      for (int c = 0; c < NK; ++c) ksum = dot16(ksum, k[c], ones);
      vst1q_s32(sc.ipart + (G * kBlock + j) * 4, ksum);
      for (int h = 0; h < G; ++h) {
        const int8_t* q = qb + h * D;
        int32x4_t x = vdupq_n_s32(0);
        for (int c = 0; c < NK; ++c) x = dot16(x, k[c], vld1q_s8(q + 16 * c));
        vst1q_s32(sc.ipart + (h * kBlock + j) * 4, x);
      }
    }
    // four keys at a time (past len: lanes never used; kBlock is a multiple of 4)
    auto lanes = [&sc](int64_t row) {
      const int32_t* p = sc.ipart + row * 4;
      return hsum4x4(vld1q_s32(p), vld1q_s32(p + 4), vld1q_s32(p + 8), vld1q_s32(p + 12));
    };
    for (int64_t j = 0; j < len; j += 4) {
      const int32x4_t kz4 = vld1q_s32(sc.kzi + j);
      const int32x4_t bk = vsubq_s32(lanes(G * kBlock + j), vmulq_n_s32(kz4, D));  // K - D kz
      const float32x4_t ksv = vld1q_f32(sc.ksc + j);
      for (int h = 0; h < G; ++h) {
        int32x4_t dot = vmlsq_n_s32(lanes(h * kBlock + j), kz4, sc.q8sum[t0 + h]);
        dot = vmlsq_n_s32(dot, bk, sc.q8zp[t0 + h]);
        vst1q_f32(sc.s + h * kBlock + j, vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(dot), ksv), sc.q8sc[t0 + h]));
      }
    }
  } else
  // Float queries: per key row, its D int8 converted 16 at a time and dotted with every head's
  // query.
  for (int64_t j = 0; j < len; ++j) {
    const int8_t* kr = kd + (jb + j) * K.ss;
    ahead(j);
    float32x4_t x[G][2];
    for (int h = 0; h < G; ++h) x[h][0] = x[h][1] = vdupq_n_f32(0.f);
    for (int c = 0; c < D; c += 16) {
      float32x4_t k[4];
      cvt16(kr + c, k);
      for (int h = 0; h < G; ++h) {
        const float* q = sc.q + (t0 + h) * D + c;
        x[h][0] = vfmaq_f32(x[h][0], vld1q_f32(q), k[0]);
        x[h][1] = vfmaq_f32(x[h][1], vld1q_f32(q + 4), k[1]);
        x[h][0] = vfmaq_f32(x[h][0], vld1q_f32(q + 8), k[2]);
        x[h][1] = vfmaq_f32(x[h][1], vld1q_f32(q + 12), k[3]);
      }
    }
    for (int h = 0; h < G; ++h)
      sc.s[h * kBlock + j] = sc.ksc[j] * (vaddvq_f32(vaddq_f32(x[h][0], x[h][1])) - sc.kzp[j] * sc.qsum[t0 + h]);
  }

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
    if (corr != 1.f) {
      float* acc = sc.acc + t * D;
      const float32x4_t vc = vdupq_n_f32(corr);
      for (int d = 0; d < D; d += 4) vst1q_f32(acc + d, vmulq_f32(vld1q_f32(acc + d), vc));
    }
    const float32x4_t vmn = vdupq_n_f32(mn);
    float32x4_t vsum = vdupq_n_f32(0.f), vzc = vsum;
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
      const float32x4_t e = exp4(vsubq_f32(vld1q_f32(srow + j), vmn));
      const float32x4_t w = vmulq_f32(e, vld1q_f32(sc.vsc + j));
      vst1q_f32(srow + j, w);
      vsum = vaddq_f32(vsum, e);
      vzc = vfmaq_f32(vzc, w, vld1q_f32(sc.vzp + j));
    }
    float sum = vaddvq_f32(vsum), zc = vaddvq_f32(vzc);
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

  // Weighted sums: 8 dims at a time, all G heads in registers.
  for (int c = 0; c < D; c += 8) {
    float32x4_t o[G][2];
    for (int h = 0; h < G; ++h) {
      o[h][0] = vld1q_f32(sc.acc + (t0 + h) * D + c);
      o[h][1] = vld1q_f32(sc.acc + (t0 + h) * D + c + 4);
    }
    const int8_t* vr = vd + jb * V.ss + c;
    for (int64_t j = 0; j < len; ++j, vr += V.ss) {
      const int16x8_t v16 = vmovl_s8(vld1_s8(vr));
      const float32x4_t v0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v16)));
      const float32x4_t v1 = vcvtq_f32_s32(vmovl_high_s16(v16));
      for (int h = 0; h < G; ++h) {
        const float w = sc.s[h * kBlock + j];
        o[h][0] = vfmaq_n_f32(o[h][0], v0, w);
        o[h][1] = vfmaq_n_f32(o[h][1], v1, w);
      }
    }
    for (int h = 0; h < G; ++h) {
      const float32x4_t z = vdupq_n_f32(sc.zc[h]);
      vst1q_f32(sc.acc + (t0 + h) * D + c, vsubq_f32(o[h][0], z));
      vst1q_f32(sc.acc + (t0 + h) * D + c + 4, vsubq_f32(o[h][1], z));
    }
  }
}

template <int G, int D>
void decode(const AttnArgs& a, int64_t b, int64_t i, int64_t j0, int64_t j1, float* pm, float* pl, float* pacc) {
  Scratch& sc = scratch();
  const int64_t H = a.H, Hkv = a.Hkv;
  for (int64_t t = 0; t < H; ++t) {
    if (a.q.f32 != nullptr) {  // float scores: the query times the softmax scale, and its sum
      float* dst = sc.q + t * D;
      const float* src = a.q.f32 + b * a.q.sb + i * a.q.ss + t * a.q.sh;
      float s = 0;
      for (int d = 0; d < D; ++d) s += (dst[d] = src[d] * a.scale);
      sc.qsum[t] = s;
    } else {  // exact scores
      sc.q8sum[t] = raw_query(a, b, i, t, D, sc.q8 + t * D, sc.q8zp[t], sc.q8sc[t]);
    }
    sc.m[t] = -INFINITY;
    sc.l[t] = 0.f;
    std::fill(sc.acc + t * D, sc.acc + (t + 1) * D, 0.f);
  }

  int64_t lim = a.n_kv;
  if (a.causal) lim = std::min(lim, a.start_pos + i + 1);
  const int64_t jend = std::min(j1, lim);
  const float* mrow = a.mask ? a.mask + i * a.mask_ss : nullptr;
  // Block by block, every kv head: the thread reads its key range's rows in order.
  for (int64_t jb = j0; jb < jend; jb += kBlock) {
    const int64_t len = std::min(kBlock, jend - jb);
    const int64_t n_ahead = std::min(kBlock, jend - (jb + kAhead * kBlock));
    for (int64_t g = 0; g < Hkv; ++g) decode_block<G, D>(a, sc, b, g, jb, len, n_ahead, mrow);
  }

  for (int64_t t = 0; t < H; ++t) {
    const float* acc = sc.acc + t * D;
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

using DecodeFn = void (*)(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, float*, float*, float*);

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
  return a.k.i8 != nullptr && a.v.i8 != nullptr && a.k.tiled == 0 && a.v.tiled == 0 && pick(a) != nullptr;
}

bool decode_reads_tiles() { return false; }

void attend_decode(const AttnArgs& a, int64_t b, int64_t i, int64_t j0, int64_t j1, float* m, float* l,
                   float* acc) {
  pick(a)(a, b, i, j0, j1, m, l, acc);
}

}  // namespace etserve

#endif  // ETS_NEON
