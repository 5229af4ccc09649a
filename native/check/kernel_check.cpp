// kernel_check: etserve's attention and 4-bit linear kernels against float64 references, at the
// shapes of tests/native (test_llm_ops.py's SHAPES, test_linear_q4.py's layers), as one small
// program with no Python and no ExecuTorch runtime: it runs where the Python tests cannot, under
// user-mode emulation (qemu-aarch64 for the ARM build, qemu-x86_64 with an old CPU model for the
// baseline x86-64 kernels), and on the host once per CPU tier it has (ETSERVE_ISA).
//
//   kernel_check [-v]     exit status 0 when every case is within its bound
//
// The bounds are those of the Python tests: 1e-4 for fp32 caches; for int8 caches 5e-4 (the
// AVX-512 VNNI tile's 16-bit weights) and, on the decode kernel (one query row, at most 8 query
// heads per kv head, head dim 64 or 128) built for AVX-512 VNNI or AVX2, whose weights are 8- or
// 7-bit fixed point per 64-key block, 1e-3 against a reference that rounds them the same way
// (test_llm_ops.py's ref_sdpa_8bit_weights); for the
// linear, a few float32 ulps of its largest partial sums; on aarch64 the NEON sets' linear is
// also compared with the scalar set's, bit for bit. The sampler's reductions over a vocabulary
// (max, the sum of exponentials, the weights at a temperature): 1e-6 of each term and of the sum.
#include "attention.h"
#include "attention_amx.h"
#include "attention_decode.h"
#include "kernel_isa.h"
#include "kv_layout.h"    // tiled_offset
#include "kernel_table.h"  // vec:: (the sampler's reductions); on aarch64 the scalar set's linear_q4
#include "linear_q4.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

bool g_verbose = false;

struct Rng {  // splitmix64: the same cases on every machine
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int range(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo)); }  // [lo, hi)
  float normal() {  // Box-Muller
    const double u = unit() + 1e-12, v = unit();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
  }
};

struct Shape {
  int B, S, H, Hkv, D, Smax, pos;
};

// test_llm_ops.py's SHAPES
const Shape kShapes[] = {
    {1, 1, 4, 4, 64, 64, 0},    {1, 1, 4, 4, 64, 64, 30},    {1, 1, 4, 4, 64, 64, 63},
    {1, 7, 4, 4, 64, 64, 0},    {1, 7, 4, 4, 64, 64, 21},    {1, 7, 4, 4, 64, 64, 57},
    {1, 1, 9, 3, 64, 128, 0},   {1, 1, 9, 3, 64, 128, 77},   {1, 1, 9, 3, 64, 128, 127},
    {1, 33, 9, 3, 64, 128, 0},  {1, 33, 9, 3, 64, 128, 50},  {1, 33, 9, 3, 64, 128, 95},
    {2, 5, 14, 2, 8, 40, 0},    {2, 5, 14, 2, 8, 40, 17},    {2, 5, 14, 2, 8, 40, 35},
    {1, 1, 7, 1, 13, 23, 0},    {1, 1, 7, 1, 13, 23, 11},    {1, 1, 7, 1, 13, 23, 22},
    {1, 4, 7, 1, 13, 23, 19},   {2, 3, 6, 2, 72, 50, 9},     {1, 2, 3, 1, 96, 300, 298},
    {1, 1, 2, 1, 128, 512, 449}, {1, 64, 14, 2, 64, 96, 0},
};
// and the int8 tests' longer ones: prefill over 700 keys, decode over 3,000 (whole quads of keys
// in the last block, and three keys past the last quad)
const Shape kInt8Shapes[] = {{1, 40, 14, 2, 64, 700, 300}, {1, 1, 14, 2, 64, 3000, 2999},
                             {1, 1, 14, 2, 64, 3000, 2050}};

// One operand [B, N, H, D] and, for int8, its per-(b, n, h) scales and zero points; `deq` holds the
// values the kernel is meant to see (the dequantized int8, or the floats themselves).
struct Operand {
  std::vector<float> f;
  std::vector<int8_t> i8, zp;
  std::vector<float> sc;
  std::vector<double> deq;
  int B, N, H, D;
  Operand(Rng& r, int B_, int N_, int H_, int D_, bool int8) : B(B_), N(N_), H(H_), D(D_) {
    const size_t rows = size_t(B) * N * H, n = rows * D;
    deq.resize(n);
    if (!int8) {
      f.resize(n);
      for (size_t i = 0; i < n; ++i) deq[i] = f[i] = r.normal();
      return;
    }
    i8.resize(n), sc.resize(rows), zp.resize(rows);
    for (size_t i = 0; i < n; ++i) i8[i] = static_cast<int8_t>(r.range(-128, 128));
    for (size_t i = 0; i < rows; ++i) {
      sc[i] = static_cast<float>(0.002 + r.unit() * 0.048);
      zp[i] = static_cast<int8_t>(r.range(-20, 20));
    }
    for (size_t i = 0; i < n; ++i) deq[i] = (double(i8[i]) - zp[i / D]) * double(sc[i / D]);
  }
  etserve::AttnOperand view() const {
    etserve::AttnOperand o;
    o.sb = int64_t(N) * H * D, o.ss = int64_t(H) * D, o.sh = D;
    if (i8.empty()) {
      o.f32 = f.data();
      return o;
    }
    o.i8 = i8.data(), o.scale = sc.data(), o.zero_point = zp.data();
    o.sc_sb = o.zp_sb = int64_t(N) * H, o.sc_ss = o.zp_ss = H, o.sc_sh = o.zp_sh = 1;
    return o;
  }
  double at(int b, int n, int h, int d) const { return deq[((size_t(b) * N + n) * H + h) * D + d]; }
};

// The decode kernel's weight levels where its weighted sums take the weights (P times the value
// scales) as fixed point per head and 64-key block (attention_decode.cpp: one query row, at most
// 8 query heads per kv head, head dim 64 or 128): 255 with AVX-512 VNNI (vpdpbusd), 127 with
// AVX2 (vpmaddubsw); 0 where the weights stay floats.
int decode_weight_levels(const Shape& s, bool int8) {
  const char* isa = etserve::kernel_isa();
  const int G = s.H / s.Hkv;
  if (!int8 || s.S != 1 || G > 8 || (s.D != 64 && s.D != 128)) return 0;
  if (std::strcmp(isa, "avx512-vnni") == 0) return 255;
  if (std::strcmp(isa, "avx2") == 0) return 127;
  return 0;
}

// An additive mask [S, Smax]: some keys cut off (-inf), the rest moved a little, a visible key per row.
std::vector<float> random_mask(Rng& r, const Shape& s) {
  std::vector<float> mask(size_t(s.S) * s.Smax);
  for (float& m : mask) m = r.unit() < 0.2 ? -INFINITY : static_cast<float>(r.unit() - 0.5);
  for (int i = 0; i < s.S; ++i) mask[size_t(i) * s.Smax] = 0.f;
  return mask;
}

// The attention call of a case: q over k and v (row views), into out; the mask when not empty.
etserve::AttnArgs case_args(const Shape& s, const Operand& q, const Operand& k, const Operand& v, bool causal,
                            const std::vector<float>& mask, float* out) {
  etserve::AttnArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view();
  a.o = out;
  a.o_sb = int64_t(s.S) * s.H * s.D, a.o_ss = int64_t(s.H) * s.D, a.o_sh = s.D;
  a.B = s.B, a.S = s.S, a.H = s.H, a.Hkv = s.Hkv, a.D = s.D;
  a.n_kv = mask.empty() ? s.pos + s.S : s.Smax;
  a.start_pos = s.pos;
  a.causal = causal;
  a.mask = mask.empty() ? nullptr : mask.data();
  a.mask_ss = s.Smax;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  return a;
}

// softmax(q k^T / sqrt(D) + mask) v in float64, as ref_sdpa in test_llm_ops.py.
bool check_attention(const Shape& s, bool causal, bool int8, bool masked, uint64_t seed, const char* what,
                     bool q_int8 = true) {
  Rng r(seed);
  Operand q(r, s.B, s.S, s.H, s.D, int8 && q_int8), k(r, s.B, s.Smax, s.Hkv, s.D, int8), v(r, s.B, s.Smax, s.Hkv, s.D, int8);
  const std::vector<float> mask = masked ? random_mask(r, s) : std::vector<float>();
  std::vector<float> out(size_t(s.B) * s.S * s.H * s.D, NAN);
  const etserve::AttnArgs a = case_args(s, q, k, v, causal, mask, out.data());
  etserve::run_attention(a);

  // With fixed-point weights, the reference rounds them as the kernel does (test_llm_ops.py's
  // ref_sdpa_8bit_weights): per block of 64 keys from key 0 (the kernel's ranges are whole
  // blocks), each weight p v_scale to the nearest multiple of 1/levels of the block's largest;
  // the values' raw int8 less their zero points, and the weights' sum, both from those.
  const int levels = decode_weight_levels(s, int8);
  const double tol = !int8 ? 1e-4 : levels ? 1e-3 : 5e-4;
  const int G = s.H / s.Hkv;
  double worst = 0;
  std::vector<double> p(s.Smax);
  for (int b = 0; b < s.B; ++b)
    for (int i = 0; i < s.S; ++i) {
      int n = static_cast<int>(a.n_kv);
      if (causal) n = std::min(n, s.pos + i + 1);
      for (int h = 0; h < s.H; ++h) {
        const int g = h / G;
        double mx = -INFINITY;
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < s.D; ++d) dot += q.at(b, i, h, d) * k.at(b, j, g, d);
          p[j] = dot / std::sqrt(double(s.D)) + (masked ? mask[size_t(i) * s.Smax + j] : 0.0);
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
        const auto row = [&](int j) { return (size_t(b) * s.Smax + j) * s.Hkv + g; };  // v's (b, j, g)
        if (levels && mx > -INFINITY) {  // p as the kernel rounds it; its sum from the rounded
          sum = 0;
          for (int j0 = 0; j0 < n; j0 += 64) {
            const int j1 = std::min(n, j0 + 64);
            double top = 0;
            for (int j = j0; j < j1; ++j) top = std::max(top, p[j] * v.sc[row(j)]);
            for (int j = j0; j < j1; ++j) {
              const double u = top > 0 ? std::min(std::nearbyint(p[j] * v.sc[row(j)] / top * levels), double(levels)) : 0;
              p[j] = u * top / levels / v.sc[row(j)];
              sum += p[j];
            }
          }
        }
        for (int d = 0; d < s.D; ++d) {
          double o = 0;
          for (int j = 0; j < n; ++j) o += p[j] * v.at(b, j, g, d);
          const double got = out[((size_t(b) * s.S + i) * s.H + h) * s.D + d];
          const double err = std::fabs(got - o / sum);
          worst = std::isnan(err) ? INFINITY : std::max(worst, err);
        }
      }
    }
  const bool ok = worst <= tol;
  if (!ok || g_verbose)
    std::printf("%s attention %s B%d S%d H%d Hkv%d D%d Smax%d pos%d %s%s: max error %.3g (bound %.3g)\n",
                ok ? "ok  " : "FAIL", what, s.B, s.S, s.H, s.Hkv, s.D, s.Smax, s.pos, causal ? "causal" : "full",
                masked ? " masked" : "", worst, tol);
  return ok;
}

// The same int8 case over caches in kv_layout.h's tiled layouts (as llm_kernels.cpp lays them
// out for the AMX kernel and the AVX2 decode kernel; every tier's generic tile copies a block's
// rows out of them): the output bit for bit the rows' (the same integer products, the same
// float steps), on every tier.
// (Where the rows would run another kernel than the tiles, nothing to compare: the AMX kernel's
// tiles, which test_llm_ops.py checks, and one row on the AVX-512 tier, whose decode kernel reads
// rows only and whose caches llm_kernels.cpp therefore leaves in rows.)
bool check_tiled(const Shape& s, bool causal, bool masked, uint64_t seed) {
  if (etserve::amx_attention_supported() ||
      (s.S == 1 && !etserve::decode_reads_tiles() && std::strcmp(etserve::kernel_isa(), "scalar") != 0))
    return true;
  Rng r(seed);
  Operand q(r, s.B, s.S, s.H, s.D, true), k(r, s.B, s.Smax, s.Hkv, s.D, true), v(r, s.B, s.Smax, s.Hkv, s.D, true);
  const std::vector<float> mask = masked ? random_mask(r, s) : std::vector<float>();
  std::vector<int8_t> kt(k.i8.size()), vt(v.i8.size());
  for (int p = 0; p < s.Smax; ++p)
    for (int h = 0; h < s.Hkv; ++h)
      for (int d = 0; d < s.D; ++d) {
        const size_t at = (size_t(p) * s.Hkv + h) * s.D + d;
        kt[etserve::tiled_offset(etserve::KvLayout::kKeyTiles, s.Hkv, p, h, d)] = k.i8[at];
        vt[etserve::tiled_offset(etserve::KvLayout::kValueTiles, s.Hkv, p, h, d)] = v.i8[at];
      }
  std::vector<float> rows(size_t(s.S) * s.H * s.D, NAN), tiled(rows.size(), NAN);
  for (int pass = 0; pass < 2; ++pass) {
    etserve::AttnArgs a = case_args(s, q, k, v, causal, mask, pass == 1 ? tiled.data() : rows.data());
    if (pass == 1) {
      a.k.i8 = kt.data(), a.v.i8 = vt.data();
      a.k.tiled = static_cast<int>(etserve::KvLayout::kKeyTiles);
      a.v.tiled = static_cast<int>(etserve::KvLayout::kValueTiles);
      a.k.hkv = a.v.hkv = s.Hkv;
    }
    etserve::run_attention(a);
  }
  const bool ok = std::memcmp(rows.data(), tiled.data(), rows.size() * sizeof(float)) == 0 &&
                  std::none_of(rows.begin(), rows.end(), [](float x) { return std::isnan(x); });
  if (!ok || g_verbose)
    std::printf("%s attention int8 tiled B%d S%d H%d Hkv%d D%d Smax%d pos%d %s%s: %s\n", ok ? "ok  " : "FAIL", s.B,
                s.S, s.H, s.Hkv, s.D, s.Smax, s.pos, causal ? "causal" : "full", masked ? " masked" : "",
                ok ? "the rows' output" : "differs from the rows' output");
  return ok;
}

uint16_t f16_bits(float x) {  // round to nearest even; normal halves (the scales are 1e-3..2e-2)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  int32_t e = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  uint32_t m = u & 0x7FFFFFu;
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (m >> 13);
  const uint32_t rest = m & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}

float f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const float v = std::ldexp(1.0f + m / 1024.0f, e - 15);
  return (h & 0x8000) ? -v : v;
}

// linear_q4 on a random layer packed as linear_q4.h describes, against the operator's arithmetic
// in float64 (app/models/linear_q4.py's reference: torchao's row quantization, then the exact
// integer products times the scales).
bool check_linear(int M, int K, int N, bool with_bias) {
  Rng r(uint64_t(M) * 1000 + N);
  const int G = K / 32;
  std::vector<int8_t> w(size_t(N) * K);
  std::vector<float> scale(size_t(N) * G);
  for (int8_t& x : w) x = static_cast<int8_t>(r.range(-8, 8));
  for (float& x : scale) x = f16_value(f16_bits(static_cast<float>(r.unit() * 0.02 + 0.001)));
  std::vector<float> bias(N);
  for (float& x : bias) x = r.normal();
  std::vector<uint8_t> packed(size_t(N) * K / 2);
  std::vector<uint16_t> scales(size_t(N) * G);
  std::vector<float> row_sums(N, 0.f);
  for (int n = 0; n < N; ++n) {
    const int blk = n / 4, rr = n % 4;
    double rs = 0;
    for (int g = 0; g < G; ++g) {
      const size_t at = (size_t(blk) * G + g) * 4 + rr;
      for (int j = 0; j < 16; ++j)
        packed[at * 16 + j] = static_cast<uint8_t>((w[size_t(n) * K + 32 * g + j] + 8) |
                                                   ((w[size_t(n) * K + 32 * g + j + 16] + 8) << 4));
      scales[at] = f16_bits(scale[size_t(n) * G + g]);
      int gs = 0;
      for (int j = 0; j < 32; ++j) gs += w[size_t(n) * K + 32 * g + j];
      rs += double(scale[size_t(n) * G + g]) * gs;
    }
    row_sums[n] = static_cast<float>(rs);
  }
  std::vector<float> x(size_t(M) * K);
  for (int m = 0; m < M; ++m) {
    const double amp = r.unit() * 3;
    for (int i = 0; i < K; ++i) x[size_t(m) * K + i] = static_cast<float>(r.normal() * amp);
  }
  x[0] = 7.5f;  // an outlier, as activations have
  std::vector<float> out(size_t(M) * N, NAN);
  etserve::linear_q4(x.data(), M, K, packed.data(), scales.data(), row_sums.data(), with_bias ? bias.data() : nullptr,
                     N, out.data());
  double worst_excess = 0, worst = 0;
  for (int m = 0; m < M; ++m) {
    const float* xr = &x[size_t(m) * K];
    float lo = 0.f, hi = 0.f;
    for (int i = 0; i < K; ++i) lo = std::min(lo, xr[i]), hi = std::max(hi, xr[i]);
    const float s = std::max((hi - lo) / 255.f, 1.1920929e-07f);
    const float zp = std::min(127.f, std::max(-128.f, -128.f - std::nearbyint(lo / s)));
    const float inv = 1.f / s;
    for (int n = 0; n < N; ++n) {
      double y = 0, mag = 0;
      for (int i = 0; i < K; ++i) {
        const float qf = std::min(127.f, std::max(-128.f, std::nearbyint(xr[i] * inv) + zp));
        const double wv = double(w[size_t(n) * K + i]) * scale[size_t(n) * G + i / 32];
        y += (double(qf) - zp) * s * wv;
        mag += std::fabs(wv) * 255;
      }
      if (with_bias) y += bias[n];
      const double err = std::fabs(out[size_t(m) * N + n] - y), bound = 4e-6 * s * mag + 1e-6;
      worst = std::isnan(err) ? INFINITY : std::max(worst, err);
      worst_excess = std::isnan(err) ? INFINITY : std::max(worst_excess, err - bound);
    }
  }
  bool ok = worst_excess <= 0;
#if defined(__aarch64__)
  // linear_q4_neon.cpp does the portable loops' arithmetic lane for lane: the same bits.
  std::vector<float> ref(size_t(M) * N, NAN);
  ets_kernels_scalar.linear_q4(x.data(), M, K, packed.data(), scales.data(), row_sums.data(),
                               with_bias ? bias.data() : nullptr, N, ref.data());
  const bool same = std::memcmp(ref.data(), out.data(), out.size() * sizeof(float)) == 0;
  if (!same) std::printf("FAIL linear_q4 M%d K%d N%d: not bit-identical to the scalar kernels\n", M, K, N);
  ok = ok && same;
#endif
  if (!ok || g_verbose)
    std::printf("%s linear_q4 M%d K%d N%d%s: max error %.3g\n", ok ? "ok  " : "FAIL", M, K, N,
                with_bias ? " bias" : "", worst);
  return ok;
}

// The sampler's reductions (kernel_table.h's vec::, the chosen tier's) over n logits with some
// banned (-inf) and some far below the best, against float64: max_of exact, sum_exp_shift and
// exp_weights (temperature 1 / s) to 1e-6 relative, per weight and in the sum, weights whose
// argument is below -87 exactly 0.
bool check_sampler(int n, float s, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(n), w(n, NAN);
  for (float& v : x) v = r.normal() * 4.f;
  for (int i = 0; i < n; i += 17) x[i] = -INFINITY;
  for (int i = 5; i < n; i += 29) x[i] = -200.f;
  double best = -INFINITY;
  for (float v : x) best = std::max(best, double(v));
  const float mx = etserve::vec::max_of(x.data(), n);
  double ref_sum = 0, ref_w = 0, worst = 0;
  for (int i = 0; i < n; ++i) ref_sum += std::exp(double(x[i]) - mx);
  const double sum = etserve::vec::sum_exp_shift(x.data(), n, mx);
  const double total = etserve::vec::exp_weights(x.data(), w.data(), n, mx, s);
  bool ok = mx == best && std::fabs(sum - ref_sum) <= 1e-6 * ref_sum;
  for (int i = 0; i < n; ++i) {
    const float a = (x[i] - mx) * s;
    const double e = a >= -87.0f ? std::exp(double(a)) : 0.0;
    ref_w += e;
    const double err = std::fabs(double(w[i]) - e);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err / std::max(e, 1e-300));
    ok = ok && err <= 1e-6 * e;
  }
  ok = ok && std::fabs(total - ref_w) <= 1e-6 * ref_w;
  if (!ok || g_verbose)
    std::printf("%s sampler n%d s%g: max %g (best %g), sum %.9g (%.9g), weights' sum %.9g (%.9g), worst %.3g\n",
                ok ? "ok  " : "FAIL", n, double(s), double(mx), best, sum, ref_sum, total, ref_w, worst);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  g_verbose = argc > 1 && std::strcmp(argv[1], "-v") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--tier") == 0) {  // the kernel set this CPU gets, no cases
    std::printf("kernel_check (%s kernels): tier only\n", etserve::kernel_isa());
    return 0;
  }
  int cases = 0, failed = 0;
  auto count = [&](bool ok) { ++cases, failed += !ok; };
  uint64_t seed = 1;
  for (const Shape& s : kShapes)
    for (bool causal : {true, false}) {
      count(check_attention(s, causal, false, false, seed++, "fp32"));
      count(check_attention(s, causal, true, false, seed++, "int8"));
    }
  for (const Shape& s : kInt8Shapes)
    for (bool causal : {true, false}) count(check_attention(s, causal, true, false, seed++, "int8"));
  for (size_t i = 0; i < sizeof(kShapes) / sizeof(kShapes[0]); i += 2) {
    count(check_attention(kShapes[i], false, false, true, seed++, "fp32"));
    count(check_attention(kShapes[i], false, true, true, seed++, "int8"));
  }
  // tiled caches: the shapes above whose caches a model would tile (batch 1, head dim 64, a
  // multiple of 64 positions), and decode and prefill over a few thousand keys
  const Shape kTiledShapes[] = {{1, 1, 14, 2, 64, 3008, 2999}, {1, 1, 14, 2, 64, 3008, 2050},
                                {1, 40, 14, 2, 64, 704, 300}, {1, 1, 16, 2, 64, 320, 200}};
  for (const Shape& s : kShapes)
    if (s.B == 1 && s.D == 64 && s.Smax % 64 == 0)
      for (bool causal : {true, false}) count(check_tiled(s, causal, false, seed++));
  for (const Shape& s : kTiledShapes)
    for (bool masked : {false, true}) count(check_tiled(s, !masked, masked, seed++));
  // float queries over int8 caches, one row: the decode kernels' float dot products (the
  // operators pair int8 caches with int8 queries; attention_decode.cpp keeps the path)
  for (const Shape& s : kShapes)
    if (s.S == 1 && decode_weight_levels(s, true) != 0)
      for (bool masked : {false, true}) count(check_attention(s, !masked, true, masked, seed++, "fp32-q int8-kv", false));
  // test_linear_q4.py's layers: decode rows, pairs, prefill panels, AMX tiles of 16 rows
  const struct { int m, k, n; bool bias; } kLayers[] = {
      {1, 64, 4, false},   {1, 896, 896, true}, {1, 4864, 20, false}, {2, 128, 8, true},
      {7, 160, 36, true},  {13, 160, 36, false}, {64, 896, 40, false}, {6, 4864, 20, true},
      {3, 64, 8, false},   {16, 160, 32, true},  {37, 896, 52, false}, {128, 4864, 48, true},
  };
  for (const auto& l : kLayers) count(check_linear(l.m, l.k, l.n, l.bias));
  // a few logits (the vectors' tails), SmolLM2's and Qwen2's vocabularies; temperatures 1, 0.7, 1.5
  const struct { int n; float s; } kVocabs[] = {{3, 1.f}, {13, 1.f / 0.7f}, {49152, 1.f}, {151936, 1.f / 1.5f}};
  for (const auto& v : kVocabs) count(check_sampler(v.n, v.s, seed++));
  std::printf("kernel_check (%s kernels): %d cases, %d failed\n", etserve::kernel_isa(), cases, failed);
  return failed == 0 ? 0 : 1;
}
