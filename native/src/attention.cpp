// Attention core: see attention.h.
#include "attention.h"

#include "simd.h"

#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace etserve {

namespace {

using namespace simd;

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

}  // namespace

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

}  // namespace etserve
