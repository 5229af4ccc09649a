// Attention core: see attention.h.
#include "attention.h"
#include "kv_layout.h"

// GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -Wmaybe-uninitialized reports where they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "attention_amx.h"
#include "attention_decode.h"
#include "isa.h"
#include "simd.h"

#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace etserve {

namespace {

using namespace simd;

constexpr int64_t kKeyBlock = 64;  // key/value rows per L1-resident block
constexpr int64_t kRowTile = 16;   // query rows per tile (prefill)
constexpr int64_t kMaxVnniD = 256; // head dims the VNNI scores take (the packed block: 64 x D bytes)

// Row (b, s, h) of an operand as floats: a pointer into fp32 data, or `buf`
// filled with the dequantized int8 row (times `mul`, folded in).
inline const float* load_row(const AttnOperand& x, int64_t b, int64_t s, int64_t h, int64_t D,
                             float* buf, float mul = 1.f) {
  if (x.f32 != nullptr) {
    const float* p = x.f32 + b * x.sb + s * x.ss + h * x.sh;
    if (mul == 1.f) return p;
    for (int64_t d = 0; d < D; ++d) buf[d] = p[d] * mul;
    return buf;
  }
  const float sc = x.scale[b * x.sc_sb + s * x.sc_ss + h * x.sc_sh];
  const int32_t zp = x.zero_point[b * x.zp_sb + s * x.zp_ss + h * x.zp_sh];
  dequant_row(x.i8 + b * x.sb + s * x.ss + h * x.sh, D, sc * mul, zp, buf);
  return buf;
}

// Per-thread work space of one tile: R rows x G heads = NQ query vectors.
struct Scratch {
  std::vector<float> q, s, acc, m, l, kf, vf;
  // int8 keys: a block's rows less their zero points (kf) and their scales (ksc);
  // int8 values: a block's rows dequantized (vf)
  std::vector<float> ksc;
  // int8 queries and keys: both less their zero points as int16 (qi, ki), the
  // queries' scales (qf), a block's exact dot products (di)
  std::vector<int16_t> qi, ki;
  std::vector<float> qf;
  std::vector<int32_t> di;
  std::vector<int64_t> lim;
  // VNNI and NEON scores (vnni_keys, raw8_keys): the queries' raw int8 rows (q8), their zero
  // points and sums (qz, qsum); a block's keys (VNNI: plus 128, transposed by quads; NEON: raw
  // rows) in kt, 64-byte aligned in ktbuf, and two integer corrections per key (ka, kb)
  std::vector<int8_t> q8;
  std::vector<int32_t> qz, qsum, ka, kb;
  std::vector<uint8_t> ktbuf;
  // VNNI weighted sums (vnni_values, vnni_weights): a block's values less their zero points
  // as int16 pairs of keys (vi, 64-byte aligned in vibuf), their sums over the block per dim
  // (vcs) and their scales (vsc); per query vector its weights as 16-bit fixed point, two
  // keys' in a dword (wq, kKeyBlock / 2 a vector), and their scale (wsc)
  std::vector<uint8_t> vibuf;
  std::vector<int32_t> vcs, wq;
  std::vector<float> vsc, wsc;
  std::vector<float> qc;  // VNNI, NEON: the queries' scales times the softmax scale
  // Tiled int8 caches (kv_layout.h): a block's key and value rows out of the tiles
  std::vector<int8_t> krows, vrows;
  Scratch(int64_t nq, int64_t rows, int64_t D)
      : q(nq * D), s(nq * kKeyBlock), acc(nq * D), m(nq), l(nq), kf(kKeyBlock * D),
        vf(kKeyBlock * D), ksc(kKeyBlock), qi(nq * D),
        ki(kKeyBlock * D), qf(nq), di(kKeyBlock), lim(rows), q8(nq * D), qz(nq), qsum(nq),
        ka(kKeyBlock), kb(kKeyBlock), ktbuf(kKeyBlock * D + 64), vibuf(kKeyBlock * D * 2 + 64),
        vcs(D), wq(nq * kKeyBlock / 2), vsc(kKeyBlock), wsc(nq), qc(nq), krows(kKeyBlock * D),
        vrows(kKeyBlock * D) {}
  uint8_t* kt() {
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ktbuf.data()) + 63) & ~uintptr_t(63));
  }
  int16_t* vi() {
    return reinterpret_cast<int16_t*>((reinterpret_cast<uintptr_t>(vibuf.data()) + 63) & ~uintptr_t(63));
  }
};

// Rows [j, end) of kv head g of the int8 keys and values asked for one row at a
// time while the kernel converts the block before (in a burst, the prefetches
// would wait for free miss buffers and hold up the work behind them).
// In a tiled cache, a line of kv head g's tile of the row's block instead, one per row: the
// block's 64 rows ask for all 64 lines of its tile.
struct RowPrefetch {
  const char* k = nullptr;
  const char* v = nullptr;
  int64_t kss = 0, vss = 0, j = 0, end = 0, g = 0, kt = 0, vt = 0;
  RowPrefetch(const AttnArgs& a, int64_t b, int64_t g_, int64_t j0, int64_t j1) : j(j0), end(j1), g(g_) {
    if (a.k.i8 != nullptr) {
      k = reinterpret_cast<const char*>(a.k.tiled ? a.k.i8 : a.k.i8 + b * a.k.sb + g * a.k.sh);
      kss = a.k.ss, kt = a.k.tiled ? a.k.hkv : 0;
    }
    if (a.v.i8 != nullptr) {
      v = reinterpret_cast<const char*>(a.v.tiled ? a.v.i8 : a.v.i8 + b * a.v.sb + g * a.v.sh);
      vss = a.v.ss, vt = a.v.tiled ? a.v.hkv : 0;
    }
  }
  const char* line(const char* base, int64_t ss, int64_t hkv) const {
    return hkv ? base + (((j >> 6) * hkv + g) * 64 + (j & 63)) * 64 : base + j * ss;
  }
  void next() {
    if (j >= end) return;
    if (k) __builtin_prefetch(line(k, kss, kt), 0, 2);
    if (v) __builtin_prefetch(line(v, vss, vt), 0, 2);
    ++j;
  }
};

#if defined(ETS_AVX2)
// 8 rows of 8 dwords -> 8 vectors, vector i holding dword i of every row.
inline void transpose8x8(__m256i r[8]) {
  __m256i t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2x128_si256(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2x128_si256(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}
#endif

// Rows [p, p + n) of kv head g of a tiled int8 cache (kv_layout.h) into dst, 64 bytes a row.
inline void rows_out_of_tiles(const AttnOperand& x, int64_t g, int64_t p, int64_t n, int8_t* dst) {
  const bool keys = x.tiled == static_cast<int>(KvLayout::kKeyTiles);
  int64_t j = 0;
#if defined(ETS_AVX2)
  if (keys) {  // 8 positions of a 16-position group at a time: two 8 x 8 dword transposes
    for (; j + 8 <= n && (p + j) % 8 == 0; j += 8) {
      const int8_t* base = x.i8 + tiled_offset(KvLayout::kKeyTiles, x.hkv, p + j, g, 0);
      for (int half = 0; half < 2; ++half) {
        __m256i r[8];
        for (int k = 0; k < 8; ++k)
          r[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + (8 * half + k) * 64));
        transpose8x8(r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (j + i) * 64 + 32 * half), r[i]);
      }
    }
  } else {  // a quad of positions at a time: its 256 bytes regrouped by position
    const __m256i by_pos = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; j + 4 <= n && (p + j) % 4 == 0; j += 4) {
      const int8_t* base = x.i8 + tiled_offset(KvLayout::kValueTiles, x.hkv, p + j, g, 0);
      __m256i z[8];  // qword k of z[c]: dims 8c.. of position k
      for (int c = 0; c < 8; ++c)
        z[c] = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 32 * c)), by_pos), pairs);
      for (int c = 0; c < 8; c += 4) {  // dims 8c .. 8c + 31 of the four positions
        const __m256i a02 = _mm256_unpacklo_epi64(z[c], z[c + 1]), a13 = _mm256_unpackhi_epi64(z[c], z[c + 1]);
        const __m256i b02 = _mm256_unpacklo_epi64(z[c + 2], z[c + 3]), b13 = _mm256_unpackhi_epi64(z[c + 2], z[c + 3]);
        int8_t* o = dst + j * 64 + 8 * c;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute2x128_si256(a02, b02, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 64), _mm256_permute2x128_si256(a13, b13, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 128), _mm256_permute2x128_si256(a02, b02, 0x31));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 192), _mm256_permute2x128_si256(a13, b13, 0x31));
      }
    }
  }
#endif
  for (; j < n; ++j) {
    const int8_t* base = x.i8 + tiled_offset(static_cast<KvLayout>(x.tiled), x.hkv, p + j, g, 0);
    int8_t* row = dst + j * 64;
    if (keys) {
      for (int64_t q = 0; q < 16; ++q) std::memcpy(row + 4 * q, base + 64 * q, 4);
    } else {
      for (int64_t d = 0; d < 64; ++d) row[d] = base[4 * d];
    }
  }
}

// A key block's rows of one kv head as the row kernels read them: the operand itself (rows),
// or, from a tiled cache (kv_layout.h), the rows copied out of the tiles into `buf` (an
// operand of 64-byte rows whose parameters start at the block).
struct BlockRows {
  AttnOperand x;
  int64_t b, j0, h;  // where the block's first row is in x
  BlockRows(const AttnOperand& op, int64_t b_, int64_t g, int64_t jb, int64_t n, int8_t* buf)
      : x(op), b(b_), j0(jb), h(g) {
    if (op.i8 == nullptr || op.tiled == 0) return;
    rows_out_of_tiles(op, g, jb, n, buf);
    x.i8 = buf;
    x.sb = x.sh = 0;
    x.ss = 64;
    x.tiled = 0;
    x.scale = op.scale + b_ * op.sc_sb + jb * op.sc_ss + g * op.sc_sh;
    x.zero_point = op.zero_point + b_ * op.zp_sb + jb * op.zp_ss + g * op.zp_sh;
    x.sc_sb = x.sc_sh = x.zp_sb = x.zp_sh = 0;
    b = j0 = h = 0;
  }
};

// Rows [j0, j0 + n) of head h of an int8 operand less their zero points, as
// floats or int16 (T) into dst (row stride D), their scales into sc.
template <typename T>
void raw_rows(const AttnOperand& x, int64_t b, int64_t j0, int64_t n, int64_t h, int64_t D,
              T* dst, float* sc, RowPrefetch* pf = nullptr) {
  const int8_t* data = x.i8 + b * x.sb + h * x.sh;
  const float* scale = x.scale + b * x.sc_sb + h * x.sc_sh;
  const int8_t* zero = x.zero_point + b * x.zp_sb + h * x.zp_sh;
  for (int64_t j = 0; j < n; ++j) {
    if constexpr (std::is_same_v<T, float>) {
      int8_to_float(data + (j0 + j) * x.ss, D, zero[(j0 + j) * x.zp_ss], dst + j * D);
    } else {
      int8_to_int16(data + (j0 + j) * x.ss, D, zero[(j0 + j) * x.zp_ss], dst + j * D);
    }
    sc[j] = scale[(j0 + j) * x.sc_ss];
    if (pf) pf->next();
  }
}

#if defined(ETS_VNNI512)
#define ETS_ATTN_VNNI 1
// Exact int32 scores with 512-bit vpdpbusd (simd.h's exact_scores16): a block's keys are
// packed plus 128 as [16-key chunk][quad of dims][16 keys][4 bytes], so one vector holds the
// same four dims of 16 keys, and every query runs D / 4 vpdpbusd per 16 keys with its raw
// quads broadcast, no horizontal sums.

// Rows [j0, j0 + n) of kv head h of the int8 keys into sc (kt, ka, kb, ksc).
void vnni_keys(const AttnOperand& x, int64_t b, int64_t j0, int64_t n, int64_t h, int64_t D,
               Scratch& sc, RowPrefetch* pf) {
  const int8_t* data = x.i8 + b * x.sb + h * x.sh;
  const float* scale = x.scale + b * x.sc_sb + h * x.sc_sh;
  const int8_t* zero = x.zero_point + b * x.zp_sb + h * x.zp_sh;
  const int64_t DQ = D / 4;
  uint32_t* kt = reinterpret_cast<uint32_t*>(sc.kt());
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* row = data + (j0 + j) * x.ss;
    uint32_t* dst = kt + (j / 16) * DQ * 16 + (j % 16);
    int32_t u = 0;
    for (int64_t q = 0; q < DQ; ++q) {
      uint32_t w;
      std::memcpy(&w, row + 4 * q, 4);
      w ^= 0x80808080u;
      dst[q * 16] = w;
      u += static_cast<int32_t>((w & 0xFF) + ((w >> 8) & 0xFF) + ((w >> 16) & 0xFF) + (w >> 24));
    }
    const int32_t a = 128 + zero[(j0 + j) * x.zp_ss];
    sc.ka[j] = a;
    sc.kb[j] = u - static_cast<int32_t>(D) * a;
    sc.ksc[j] = scale[(j0 + j) * x.sc_ss];
    if (pf) pf->next();
  }
}

// srow[0 .. 16 * ceil(vis / 16)) = the block's scores of query vector t (entries at and past
// vis are not meaningful), times the query's scale c.
void vnni_scores(Scratch& sc, int64_t t, int64_t D, int64_t vis, float c, float* srow) {
  const int64_t DQ = D / 4;
  const int32_t* q = reinterpret_cast<const int32_t*>(sc.q8.data() + t * D);
  const __m512i Q = _mm512_set1_epi32(sc.qsum[t]), qz = _mm512_set1_epi32(sc.qz[t]);
  const __m512 vc = _mm512_set1_ps(c);
  const uint8_t* kt = sc.kt();
  for (int64_t j = 0; j < vis; j += 16) {
    const uint8_t* chunk = kt + (j / 16) * DQ * 64;
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    int64_t d = 0;
    for (; d + 2 <= DQ; d += 2) {
      acc0 = _mm512_dpbusd_epi32(acc0, _mm512_load_si512(chunk + d * 64), _mm512_set1_epi32(q[d]));
      acc1 = _mm512_dpbusd_epi32(acc1, _mm512_load_si512(chunk + (d + 1) * 64), _mm512_set1_epi32(q[d + 1]));
    }
    if (d < DQ) acc0 = _mm512_dpbusd_epi32(acc0, _mm512_load_si512(chunk + d * 64), _mm512_set1_epi32(q[d]));
    _mm512_storeu_ps(srow + j, exact_scores16(_mm512_add_epi32(acc0, acc1), Q, qz,
                                              _mm512_loadu_si512(sc.ka.data() + j),
                                              _mm512_loadu_si512(sc.kb.data() + j),
                                              _mm512_loadu_ps(sc.ksc.data() + j), vc));
  }
}

// vnni_scores for every query vector of a tile (rows r with vis[r] keys of the block visible;
// query vector t = r * G + h scaled by c[t]) at once, DQ = D / 4 quads: 16 keys at a time, the
// chunk's quad vectors loaded once into registers for all of them, two queries interleaved.
template <int DQ>
void vnni_scores_tile(Scratch& sc, int64_t R, int64_t G, const int64_t* vis, int64_t vis_max, const float* c) {
  const uint8_t* kt = sc.kt();
  for (int64_t j = 0; j < vis_max; j += 16) {
    const uint8_t* chunk = kt + (j / 16) * DQ * 64;
    __m512i kv[DQ];
    for (int d = 0; d < DQ; ++d) kv[d] = _mm512_load_si512(chunk + d * 64);
    const __m512i A = _mm512_loadu_si512(sc.ka.data() + j), B = _mm512_loadu_si512(sc.kb.data() + j);
    const __m512 ks = _mm512_loadu_ps(sc.ksc.data() + j);
    auto finish = [&](int64_t t, __m512i dot) {
      _mm512_storeu_ps(sc.s.data() + t * kKeyBlock + j,
                       exact_scores16(dot, _mm512_set1_epi32(sc.qsum[t]), _mm512_set1_epi32(sc.qz[t]), A, B, ks,
                                      _mm512_set1_ps(c[t])));
    };
    for (int64_t r = 0; r < R; ++r) {
      if (vis[r] <= j) continue;
      int64_t t = r * G;
      const int64_t t_end = t + G;
      for (; t + 2 <= t_end; t += 2) {
        const int32_t* q0 = reinterpret_cast<const int32_t*>(sc.q8.data() + t * DQ * 4);
        const int32_t* q1 = q0 + DQ;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
        for (int d = 0; d < DQ; d += 2) {
          a0 = dpbusd(a0, kv[d], q0 + d);
          b0 = dpbusd(b0, kv[d], q1 + d);
          a1 = dpbusd(a1, kv[d + 1], q0 + d + 1);
          b1 = dpbusd(b1, kv[d + 1], q1 + d + 1);
        }
        finish(t, _mm512_add_epi32(a0, a1));
        finish(t + 1, _mm512_add_epi32(b0, b1));
      }
      if (t < t_end) {
        const int32_t* q0 = reinterpret_cast<const int32_t*>(sc.q8.data() + t * DQ * 4);
        __m512i a0 = _mm512_setzero_si512(), a1 = a0;
        for (int d = 0; d < DQ; d += 2) {
          a0 = dpbusd(a0, kv[d], q0 + d);
          a1 = dpbusd(a1, kv[d + 1], q0 + d + 1);
        }
        finish(t, _mm512_add_epi32(a0, a1));
      }
    }
  }
}

// Integer weighted sums with 512-bit vpdpwssd, as the decode kernel does them (see
// attention_decode.cpp): per query vector and block, the weights w = e * v_scale become 16-bit
// fixed point u = round(w / wsc) over [0, max w] (an error of at most 2^-17 of the block's
// largest weight per key), stored as u - 32768; the block's values less their zero points are
// int16 ([-255, 255]), two keys' interleaved in each dword, once for the whole tile. Then
//   sum_j u_j (v_j - z_j) = sum_j (u_j - 32768)(v_j - z_j) + 32768 sum_j (v_j - z_j),
// all in int32 (at most 2 * 64 * 32768 * 255 < 2^31). A key a row does not see has u = 0, so
// the block's sums over every loaded row serve each row.

// Rows [j0, j0 + n) of kv head h of the int8 values into sc: vi as [pair of keys][D / 16]
// [16 dims x 2 keys] (an odd last row paired with zeros), vcs, vsc.
void vnni_values(const AttnOperand& x, int64_t b, int64_t j0, int64_t n, int64_t h, int64_t D, Scratch& sc) {
  alignas(64) static constexpr int16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                          21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                          11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave), ones = _mm512_set1_epi16(1);
  const int8_t* data = x.i8 + b * x.sb + h * x.sh;
  const float* scale = x.scale + b * x.sc_sb + h * x.sc_sh;
  const int8_t* zero = x.zero_point + b * x.zp_sb + h * x.zp_sh;
  const int64_t DV = D / 16;
  int16_t* vi = sc.vi();
  __m512i cs[kMaxVnniD / 16];
  for (int64_t c = 0; c < DV; ++c) cs[c] = _mm512_setzero_si512();
  for (int64_t j = 0; j < n; j += 2) {
    const bool two = j + 1 < n;
    const int8_t* ra = data + (j0 + j) * x.ss;
    const int8_t* rb = two ? ra + x.ss : nullptr;
    const int32_t za = zero[(j0 + j) * x.zp_ss], zb = two ? zero[(j0 + j + 1) * x.zp_ss] : 0;
    const __m512i zz = _mm512_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(zb) << 16) |
                                                              (static_cast<uint32_t>(za) & 0xFFFFu)));
    sc.vsc[j] = scale[(j0 + j) * x.sc_ss];
    if (two) sc.vsc[j + 1] = scale[(j0 + j + 1) * x.sc_ss];
    int16_t* dst = vi + (j / 2) * D * 2;
    for (int64_t c = 0; c < DV; ++c) {
      const __m256i a16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ra + c * 16)));
      const __m256i b16 = two ? _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rb + c * 16)))
                              : _mm256_setzero_si256();
      const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a16), b16, 1);
      const __m512i v = _mm512_sub_epi16(_mm512_permutexvar_epi16(idx, ab), zz);
      _mm512_store_si512(dst + c * 32, v);
      cs[c] = _mm512_add_epi32(cs[c], _mm512_madd_epi16(v, ones));
    }
  }
  for (int64_t c = 0; c < DV; ++c) _mm512_storeu_si512(sc.vcs.data() + c * 16, cs[c]);
}

// wq of query vector t over the block's np pairs of keys from its exponentials e (srow, keys
// [0, vis) visible) and the value scales; returns wsc (0 when every weight is 0).
float vnni_weights(Scratch& sc, int64_t t, const float* srow, int64_t vis, int64_t np) {
  alignas(64) float w[kKeyBlock];
  int16_t* wq = reinterpret_cast<int16_t*>(sc.wq.data() + t * (kKeyBlock / 2));
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t j = 0; j < 2 * np; j += 16) {
    const int64_t left = vis - j;
    const __mmask16 m = left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, srow + j), _mm512_maskz_loadu_ps(m, sc.vsc.data() + j));
    _mm512_store_ps(w + j, x);
    vmax = _mm512_max_ps(vmax, x);
  }
  const float wmax = _mm512_reduce_max_ps(vmax);
  if (!(wmax > 0.f)) {
    std::fill(wq, wq + 2 * np, static_cast<int16_t>(-32768));
    return 0.f;
  }
  const __m512 f = _mm512_set1_ps(65535.f / wmax);
  const __m512i top = _mm512_set1_epi32(65535), half = _mm512_set1_epi32(32768);
  for (int64_t j = 0; j < 2 * np; j += 16) {
    const __m512i u = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(w + j), f)), top);
    const __m256i q = _mm512_cvtepi32_epi16(_mm512_sub_epi32(u, half));
    if (2 * np - j >= 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wq + j), q);
    } else {
      alignas(32) int16_t tmp[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), q);
      std::copy(tmp, tmp + (2 * np - j), wq + j);
    }
  }
  return wmax / 65535.f;
}

// acc of query vectors [t0, t0 + QV) (D floats each, in order) += wsc * the block's integer
// weighted sums over its np pairs of keys, for dims [16 c0, 16 (c0 + NC)).
template <int QV, int NC>
inline void vnni_pv_dims(Scratch& sc, int64_t t0, int64_t np, int64_t D, int64_t c0, float* acc) {
  const int16_t* vi = sc.vi() + c0 * 32;
  const int32_t* wq = sc.wq.data() + t0 * (kKeyBlock / 2);
  const int64_t stride = D * 2;  // int16 a pair of keys
  __m512i o[QV][NC];
  for (int q = 0; q < QV; ++q)
    for (int k = 0; k < NC; ++k) o[q][k] = _mm512_setzero_si512();
  for (int64_t p = 0; p < np; ++p) {
    __m512i v[NC];
    for (int k = 0; k < NC; ++k) v[k] = _mm512_load_si512(vi + p * stride + k * 32);
    for (int q = 0; q < QV; ++q)
      for (int k = 0; k < NC; ++k) o[q][k] = dpwssd(o[q][k], v[k], wq + q * (kKeyBlock / 2) + p);
  }
  for (int k = 0; k < NC; ++k) {
    const __m512i off = _mm512_slli_epi32(_mm512_loadu_si512(sc.vcs.data() + (c0 + k) * 16), 15);
    for (int q = 0; q < QV; ++q) {
      float* a = acc + (t0 + q) * D + (c0 + k) * 16;
      const __m512 x = _mm512_cvtepi32_ps(_mm512_add_epi32(o[q][k], off));
      _mm512_storeu_ps(a, _mm512_fmadd_ps(x, _mm512_set1_ps(sc.wsc[t0 + q]), _mm512_loadu_ps(a)));
    }
  }
}

template <int QV>
void vnni_pv(Scratch& sc, int64_t t0, int64_t np, int64_t D, float* acc) {
  const int64_t DV = D / 16;
  int64_t c0 = 0;
  for (; c0 + 4 <= DV; c0 += 4) vnni_pv_dims<QV, 4>(sc, t0, np, D, c0, acc);
  switch (DV - c0) {
    case 3: vnni_pv_dims<QV, 3>(sc, t0, np, D, c0, acc); break;
    case 2: vnni_pv_dims<QV, 2>(sc, t0, np, D, c0, acc); break;
    case 1: vnni_pv_dims<QV, 1>(sc, t0, np, D, c0, acc); break;
    default: break;
  }
}
#endif

#if defined(ETS_NEON)
#define ETS_ATTN_RAW8 1
// Exact int32 scores on the aarch64 NEON tiers, as the VNNI ones: a block's keys as their raw int8
// rows, contiguous (kt), with ka = k_zp and kb = sum(k) - D k_zp per key, so that
// sum (q - qz)(k - kz) = q . k - Q ka - qz kb (Q = sum(q)); each query's raw row against eight
// keys at a time, D / 16 dot16 per key (SDOT on the dotprod tier, widening multiplies on the
// plain one), the lanes summed pairwise.

// Rows [j0, j0 + n) of kv head h of the int8 keys into sc (kt, ka, kb, ksc); the rows after
// them up to the next multiple of 8 zeros.
void raw8_keys(const AttnOperand& x, int64_t b, int64_t j0, int64_t n, int64_t h, int64_t D, Scratch& sc,
               RowPrefetch* pf) {
  const int8_t* data = x.i8 + b * x.sb + h * x.sh;
  const float* scale = x.scale + b * x.sc_sb + h * x.sc_sh;
  const int8_t* zero = x.zero_point + b * x.zp_sb + h * x.zp_sh;
  int8_t* kt = reinterpret_cast<int8_t*>(sc.kt());
  const int8x16_t ones = vdupq_n_s8(1);
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* row = data + (j0 + j) * x.ss;
    int32x4_t sum = vdupq_n_s32(0);
    for (int64_t d = 0; d < D; d += 16) {
      const int8x16_t v = vld1q_s8(row + d);
      vst1q_s8(kt + j * D + d, v);
      sum = neon::dot16(sum, v, ones);
    }
    const int32_t a = zero[(j0 + j) * x.zp_ss];
    sc.ka[j] = a;
    sc.kb[j] = vaddvq_s32(sum) - static_cast<int32_t>(D) * a;
    sc.ksc[j] = scale[(j0 + j) * x.sc_ss];
    if (pf) pf->next();
  }
  for (int64_t j = n; j < (n + 7) / 8 * 8; ++j) {
    std::memset(kt + j * D, 0, D);
    sc.ka[j] = sc.kb[j] = 0;
    sc.ksc[j] = 0.f;
  }
}

// srow[0 .. 8 * ceil(vis / 8)) = the block's scores of query vector t (entries at and past vis
// are not meaningful), times the query's scale c.
void raw8_scores(Scratch& sc, int64_t t, int64_t D, int64_t vis, float c, float* srow) {
  const int8_t* q = sc.q8.data() + t * D;
  const int8_t* kt = reinterpret_cast<const int8_t*>(sc.kt());
  const int32x4_t Q = vdupq_n_s32(sc.qsum[t]), qz = vdupq_n_s32(sc.qz[t]);
  for (int64_t j = 0; j < vis; j += 8) {
    int32x4_t a[8];
    for (int r = 0; r < 8; ++r) a[r] = vdupq_n_s32(0);
    for (int64_t d = 0; d < D; d += 16) {
      const int8x16_t qv = vld1q_s8(q + d);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) a[r] = neon::dot16(a[r], qv, vld1q_s8(kt + (j + r) * D + d));
    }
    for (int half = 0; half < 2; ++half) {
      const int64_t k = j + 4 * half;
      int32x4_t dot = neon::hsum4x4(a[4 * half], a[4 * half + 1], a[4 * half + 2], a[4 * half + 3]);
      dot = vmlsq_s32(dot, Q, vld1q_s32(sc.ka.data() + k));
      dot = vmlsq_s32(dot, qz, vld1q_s32(sc.kb.data() + k));
      vst1q_f32(srow + k, vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(dot), vld1q_f32(sc.ksc.data() + k)), c));
    }
  }
}
#endif

// Where a tile's results go: normalized into the output, or (key-split
// decode) per query vector the running max, the sum of exponentials and the
// unnormalized weighted sum, merged later.
struct Partial {
  float* m;
  float* l;
  float* acc;
};

// Attention of query rows [i0, i0 + R) of batch b, the G heads sharing kv
// head g, over keys [j0, j1) (cut further per row by the causal limit).
void attend_tile(const AttnArgs& a, int64_t b, int64_t i0, int64_t R, int64_t g, int64_t j0,
                 int64_t j1, Scratch& sc, const Partial* partial) {
  const int64_t G = a.H / a.Hkv, D = a.D, NQ = R * G;
  float* qs = sc.q.data();
  float* acc = sc.acc.data();
  float* m = sc.m.data();
  float* l = sc.l.data();
  int64_t jmax = j0;
  // int8 keys are read less their zero points (exact), their scales applied to
  // the scores instead of to every element; with int8 queries too, the scores'
  // dot products are exact in int32 (the queries as int16 then, or raw with
  // VNNI or NEON). int8 values: a block's rows dequantized once for the whole tile, or with
  // VNNI converted once to int16 pairs for integer weighted sums (vnni_values).
  const bool k8 = a.k.f32 == nullptr;
  const bool exact = k8 && a.q.f32 == nullptr;
#if defined(ETS_ATTN_VNNI)
  const bool vnni = exact && D % 4 == 0 && D <= kMaxVnniD;
  const bool vnni_v = a.v.i8 != nullptr && D % 16 == 0 && D <= kMaxVnniD;  // integer weighted sums
#else
  constexpr bool vnni = false;
#endif
#if defined(ETS_ATTN_RAW8)
  const bool raw8 = exact && D % 16 == 0 && D <= kMaxVnniD;
#else
  constexpr bool raw8 = false;
#endif
  for (int64_t r = 0; r < R; ++r) {
    int64_t lim = a.n_kv;
    if (a.causal) lim = std::min(lim, a.start_pos + i0 + r + 1);
    sc.lim[r] = std::min(lim, j1);
    jmax = std::max(jmax, sc.lim[r]);
    for (int64_t h = 0; h < G; ++h) {
      const int64_t t = r * G + h;
      if (vnni || raw8) {  // raw int8 rows
        sc.qsum[t] = raw_query(a, b, i0 + r, g * G + h, D, sc.q8.data() + t * D, sc.qz[t], sc.qc[t]);
        continue;
      }
      if (exact) {
        raw_rows(a.q, b, i0 + r, 1, g * G + h, D, sc.qi.data() + t * D, sc.qf.data() + t);
        continue;
      }
      float* dst = qs + t * D;
      const float* src = load_row(a.q, b, i0 + r, g * G + h, D, dst, a.scale);
      if (src != dst) std::copy(src, src + D, dst);
    }
  }
  std::fill(acc, acc + NQ * D, 0.f);
  std::fill(m, m + NQ, -INFINITY);
  std::fill(l, l + NQ, 0.f);

  for (int64_t jb = j0; jb < jmax; jb += kKeyBlock) {
    const int64_t len = std::min(kKeyBlock, jmax - jb);
    // Key rows of the block (fp32 in place, or converted once for the tile).
    const float* kp;
    int64_t ks;
    // The rows of the block after the next, on their way while this one is worked.
    RowPrefetch pf(a, b, g, jb + 2 * kKeyBlock, std::min(jb + 3 * kKeyBlock, jmax));
    const BlockRows kr(a.k, b, g, jb, len, sc.krows.data());
    if (a.k.f32 != nullptr) {
      kp = a.k.f32 + b * a.k.sb + jb * a.k.ss + g * a.k.sh;
      ks = a.k.ss;
    } else if (vnni) {
#if defined(ETS_ATTN_VNNI)
      vnni_keys(kr.x, kr.b, kr.j0, len, kr.h, D, sc, &pf);
#endif
      kp = nullptr;
      ks = D;
    } else if (raw8) {
#if defined(ETS_ATTN_RAW8)
      raw8_keys(kr.x, kr.b, kr.j0, len, kr.h, D, sc, &pf);
#endif
      kp = nullptr;
      ks = D;
    } else if (exact) {
      raw_rows(kr.x, kr.b, kr.j0, len, kr.h, D, sc.ki.data(), sc.ksc.data(), &pf);
      kp = nullptr;
      ks = D;
    } else {
      raw_rows(kr.x, kr.b, kr.j0, len, kr.h, D, sc.kf.data(), sc.ksc.data(), &pf);
      kp = sc.kf.data();
      ks = D;
    }
    // Keys of this block each row sees, and that some row sees.
    int64_t vis[kRowTile], vis_max = 0;
    for (int64_t r = 0; r < R; ++r) {
      vis[r] = std::clamp<int64_t>(sc.lim[r] - jb, 0, len);
      vis_max = std::max(vis_max, vis[r]);
    }
    // Scores, 8 keys at a time for every query vector of the tile (VNNI: 16).
#if defined(ETS_ATTN_VNNI)
    if (vnni && D == 64)
      vnni_scores_tile<16>(sc, R, G, vis, vis_max, sc.qc.data());
    else
#endif
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t h = 0; h < G; ++h) {
        const int64_t t = r * G + h;
        float* srow = sc.s.data() + t * kKeyBlock;
        int64_t j = 0;
        if (vnni) {
#if defined(ETS_ATTN_VNNI)
          if (vis[r] > 0) vnni_scores(sc, t, D, vis[r], sc.qc[t], srow);
#endif
          continue;
        }
        if (raw8) {
#if defined(ETS_ATTN_RAW8)
          if (vis[r] > 0) raw8_scores(sc, t, D, vis[r], sc.qc[t], srow);
#endif
          continue;
        }
        if (exact) {
          const int16_t* qv = sc.qi.data() + t * D;
          const int16_t* kv = sc.ki.data();
          int32_t* di = sc.di.data();
          for (; j + 8 <= vis[r]; j += 8) dot8_i16(qv, kv + j * D, D, D, di + j);
          for (; j < vis[r]; ++j) di[j] = dot1_i16(qv, kv + j * D, D);
          scale_ints(di, sc.ksc.data(), sc.qf[t] * a.scale, vis[r], srow);
          continue;
        }
        const float* qv = qs + t * D;
        for (; j + 8 <= vis[r]; j += 8) dot8(qv, kp + j * ks, ks, D, srow + j);
        for (; j < vis[r]; ++j) srow[j] = dot1(qv, kp + j * ks, D);
        if (k8) mul_elems(srow, sc.ksc.data(), vis[r], srow);
      }
    }
    if (vis_max == 0) continue;
    // Online softmax: rescale what came before to the new running max.
    for (int64_t r = 0; r < R; ++r) {
      if (vis[r] == 0) continue;
      const float* mrow = a.mask ? a.mask + (i0 + r) * a.mask_ss + jb : nullptr;
      for (int64_t h = 0; h < G; ++h) {
        const int64_t t = r * G + h;
        float* srow = sc.s.data() + t * kKeyBlock;
        const float bm = add_max(srow, mrow, vis[r]);
        const float mn = std::max(m[t], bm);
        if (!(mn > -INFINITY)) {  // everything so far masked out
          std::fill(srow, srow + vis[r], 0.f);
          continue;
        }
        const float corr = m[t] > -INFINITY ? std::exp(m[t] - mn) : 0.f;
        const float sum = exp_shift_sum(srow, vis[r], mn);
        if (corr != 1.f) scale_row(acc + t * D, D, corr);
        l[t] = l[t] * corr + sum;
        m[t] = mn;
      }
    }
    const BlockRows vr(a.v, b, g, jb, vis_max, sc.vrows.data());
#if defined(ETS_ATTN_VNNI)
    if (vnni_v) {
      vnni_values(vr.x, vr.b, vr.j0, vis_max, vr.h, D, sc);
      const int64_t np = (vis_max + 1) / 2;
      for (int64_t t = 0; t < NQ; ++t) sc.wsc[t] = vnni_weights(sc, t, sc.s.data() + t * kKeyBlock, vis[t / G], np);
      int64_t t = 0;
      for (; t + 4 <= NQ; t += 4) vnni_pv<4>(sc, t, np, D, acc);
      for (; t < NQ; ++t) vnni_pv<1>(sc, t, np, D, acc);
      continue;
    }
#endif
    // Value rows, then the weighted sums.
    const float* vp;
    int64_t vs;
    if (a.v.f32 != nullptr) {
      vp = a.v.f32 + b * a.v.sb + jb * a.v.ss + g * a.v.sh;
      vs = a.v.ss;
    } else {
      // the values themselves, each row dequantized once for the whole tile
      for (int64_t j = 0; j < vis_max; ++j) load_row(vr.x, vr.b, vr.j0 + j, vr.h, D, sc.vf.data() + j * D);
      vp = sc.vf.data();
      vs = D;
    }
    for (int64_t r = 0; r < R; ++r) {
      if (vis[r] == 0) continue;
      const float* p = sc.s.data() + r * G * kKeyBlock;
      float* o = acc + r * G * D;
      int64_t h = 0;
      for (; h + 2 <= G; h += 2)  // the heads of a row see the same keys: two at a time
        weighted_acc2(p + h * kKeyBlock, p + (h + 1) * kKeyBlock, vis[r], vp, vs, D, o + h * D, o + (h + 1) * D);
      if (h < G) weighted_acc(p + h * kKeyBlock, vis[r], vp, vs, D, o + h * D);
    }
  }

  for (int64_t r = 0; r < R; ++r) {
    for (int64_t h = 0; h < G; ++h) {
      const int64_t t = r * G + h;
      if (partial) {
        partial->m[t] = m[t];
        partial->l[t] = l[t];
        std::copy(acc + t * D, acc + (t + 1) * D, partial->acc + t * D);
        continue;
      }
      float* dst = a.o + b * a.o_sb + (i0 + r) * a.o_ss + (g * G + h) * a.o_sh;
      const float s = l[t] > 0.f ? 1.f / l[t] : 0.f;  // nothing visible: zeros
      for (int64_t d = 0; d < D; ++d) dst[d] = acc[t * D + d] * s;
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

namespace {

// CPUID leaf 7 and XCR0: AMX-TILE, AMX-BF16, AMX-INT8, AVX512-VBMI, AVX512 F/BW/VL/DQ and BF16, with
// the OS saving opmask, ZMM and tile state; then the tile data permission
// Linux asks a process to request (arch_prctl ARCH_REQ_XCOMP_PERM).
bool detect_amx() {
#if defined(ETS_WITH_AMX) && defined(__linux__)
  const char* isa = std::getenv("ETSERVE_ISA");  // cpu_tiers.cpp: a lower tier forced
  if (isa != nullptr && *isa != '\0' && std::strcmp(isa, "amx") != 0 && std::strcmp(isa, "native") != 0)
    return false;
  auto cpuid = [](unsigned leaf, unsigned sub, unsigned r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
  };
  unsigned r[4];
  cpuid(0, 0, r);
  if (r[0] < 7) return false;
  cpuid(1, 0, r);
  if (!(r[2] & (1u << 27))) return false;  // OSXSAVE
  cpuid(7, 0, r);
  const bool f = r[1] & (1u << 16), dq = r[1] & (1u << 17), bw = r[1] & (1u << 30),
             vl = r[1] & (1u << 31), vbmi = r[2] & (1u << 1);
  const bool amx_bf16 = r[3] & (1u << 22), amx_tile = r[3] & (1u << 24),
             amx_int8 = r[3] & (1u << 25);
  cpuid(7, 1, r);
  const bool avx512_bf16 = r[0] & (1u << 5);
  if (!(f && dq && bw && vl && vbmi && amx_bf16 && amx_int8 && amx_tile && avx512_bf16)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const uint64_t xcr0 = (uint64_t(hi) << 32) | lo;
  const uint64_t need = (1u << 1) | (1u << 2) | (1u << 5) | (1u << 6) | (1u << 7) |
                        (uint64_t(1) << 17) | (uint64_t(1) << 18);
  if ((xcr0 & need) != need) return false;
  constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
#else
  return false;
#endif
}

// -1 undecided; else 0 generic, 1 AMX.
std::atomic<int> g_kernel{-1};

int kernel_choice() {
  int k = g_kernel.load(std::memory_order_relaxed);
  if (k >= 0) return k;
  k = amx_attention_supported() && !attention_forced_generic() ? 1 : 0;
  g_kernel.store(k, std::memory_order_relaxed);
  return k;
}

}  // namespace

bool amx_attention_supported() {
  static const bool ok = detect_amx();
  return ok;
}

int attention_kernel(int want) {
  if (want == 0) g_kernel.store(0);
  if (want == 1) {
    if (!amx_attention_supported()) return -1;
    g_kernel.store(1);
  }
  return kernel_choice();
}

namespace {

// This thread's AMX work space for tiles of `rows` x `G` query vectors: kept
// from call to call (one per pool thread; a decode step calls once per layer).
AmxScratch* amx_scratch_for(int64_t rows, int64_t G) {
  struct Cached {
    AmxScratch* s = nullptr;
    int64_t rows = 0, nq = 0;
    ~Cached() { amx_scratch_free(s); }
  };
  thread_local Cached c;
  if (c.s == nullptr || rows > c.rows || rows * G > c.nq) {
    amx_scratch_free(c.s);
    c.s = amx_scratch_new(rows, G);
    c.rows = c.s ? rows : 0;
    c.nq = c.s ? rows * G : 0;
  }
  return c.s;
}

// One thread's tile runner: the AMX tile when it applies, else the generic tile.
class TileRunner {
 public:
  TileRunner(const AttnArgs& a, int64_t R, bool amx)
      : a_(a), amx_(amx ? amx_scratch_for(R, a.H / a.Hkv) : nullptr),
        sc_(amx_ ? 0 : R * (a.H / a.Hkv), amx_ ? 0 : R, amx_ ? 0 : a.D) {}
  TileRunner(const TileRunner&) = delete;
  TileRunner& operator=(const TileRunner&) = delete;

  void run(int64_t b, int64_t i0, int64_t rows, int64_t g, int64_t j0, int64_t j1,
           const Partial* partial) {
    if (amx_ != nullptr) {
      attend_tile_amx(a_, b, i0, rows, g, j0, j1, amx_, partial ? partial->m : nullptr,
                      partial ? partial->l : nullptr, partial ? partial->acc : nullptr);
    } else {
      attend_tile(a_, b, i0, rows, g, j0, j1, sc_, partial);
    }
  }

 private:
  const AttnArgs& a_;
  AmxScratch* amx_;
  Scratch sc_;
};

// dst[0, D) = n partial softmaxes of query vector t merged and normalized: part c at
// parts + c * per holds the maxima [0, NQ), the sums [NQ, 2 NQ), the weighted sums from 2 NQ.
void merge_partials(const float* parts, int64_t n, int64_t per, int64_t NQ, int64_t t, int64_t D,
                    float* dst) {
  std::fill(dst, dst + D, 0.f);
  float M = -INFINITY;
  for (int64_t c = 0; c < n; ++c) M = std::max(M, parts[c * per + t]);
  if (!(M > -INFINITY)) return;
  float L = 0.f;
  for (int64_t c = 0; c < n; ++c) {
    const float* base = parts + c * per;
    if (!(base[t] > -INFINITY)) continue;
    const float w = std::exp(base[t] - M);
    L += w * base[NQ + t];
    const float* accp = base + 2 * NQ + t * D;
    for (int64_t d = 0; d < D; ++d) dst[d] += w * accp[d];
  }
  const float s = L > 0.f ? 1.f / L : 0.f;
  for (int64_t d = 0; d < D; ++d) dst[d] *= s;
}

// One query row (a decode step) on attention_decode.h's kernel: per batch the visible keys cut
// into one range per thread (whole blocks), every head over each, then the ranges merged.
void run_decode(const AttnArgs& a) {
  const int64_t H = a.H, D = a.D;
  const int64_t lim = a.causal ? std::min(a.n_kv, a.start_pos + 1) : a.n_kv;
  const int64_t threads = thread_count();
  int64_t ranges = 1;
  if (threads > 1 && a.B < threads && a.B * lim * H * D >= (1 << 17))  // below ~20 us: one thread
    ranges = std::min<int64_t>((threads + a.B - 1) / a.B, std::max<int64_t>(1, lim / 128));
  // keys per range, in whole blocks (rounding up may leave fewer ranges)
  const int64_t step = ((std::max<int64_t>(lim, 1) + ranges - 1) / ranges + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
  ranges = std::max<int64_t>(1, (lim + step - 1) / step);
  if (ranges == 1) {
    executorch::extension::parallel_for(0, a.B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) attend_decode(a, b, 0, 0, a.n_kv, nullptr, nullptr, nullptr);
    });
    return;
  }
  const int64_t per = H * (D + 2);  // per (batch, range): H maxima, H sums, H * D sums
  std::vector<float> part(static_cast<size_t>(a.B * ranges * per));
  executorch::extension::parallel_for(0, a.B * ranges, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / ranges, c = w % ranges;
      float* base = part.data() + w * per;
      attend_decode(a, b, 0, c * step, std::min(lim, (c + 1) * step), base, base + H, base + 2 * H);
    }
  });
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t t = 0; t < H; ++t)
      merge_partials(part.data() + b * ranges * per, ranges, per, H, t, D, a.o + b * a.o_sb + t * a.o_sh);
}

}  // namespace

void run_attention(const AttnArgs& a) {
  const int64_t G = a.H / a.Hkv;
  const int64_t R = std::min<int64_t>(a.S, kRowTile);
  const int64_t tiles = (a.S + R - 1) / R;
  const int64_t units = a.B * tiles * a.Hkv;  // (batch, row tile, kv head)
  if (units <= 0) return;
  const bool amx = amx_attention_applies(a) && kernel_choice() == 1;
  if (a.S == 1 && !amx && decode_attention_applies(a)) {
    run_decode(a);
    return;
  }
  // Unit u -> batch, first row, rows, kv head.
  auto unit = [&](int64_t u, int64_t* b, int64_t* i0, int64_t* rows, int64_t* g) {
    *g = u % a.Hkv;
    const int64_t bt = u / a.Hkv;
    *b = bt / tiles;
    *i0 = (bt % tiles) * R;
    *rows = std::min(R, a.S - *i0);
  };
  const int64_t threads = thread_count();
  const int64_t work = a.B * a.S * a.H * a.n_kv * a.D;
  if (threads <= 1 || work < (1 << 17)) {  // below ~20 us: not worth waking threads
    TileRunner run(a, R, amx);
    for (int64_t u = 0; u < units; ++u) {
      int64_t b, i0, rows, g;
      unit(u, &b, &i0, &rows, &g);
      run.run(b, i0, rows, g, 0, a.n_kv, nullptr);
    }
    return;
  }
  // Few units (decode): split the keys too, then merge the partial softmaxes.
  int64_t splits = 1;
  if (units < 2 * threads) {
    splits = (2 * threads + units - 1) / units;
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, a.n_kv / 128));
  }
  if (splits <= 1) {
    executorch::extension::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      TileRunner run(a, R, amx);
      for (int64_t u = u0; u < u1; ++u) {
        int64_t b, i0, rows, g;
        unit(u, &b, &i0, &rows, &g);
        run.run(b, i0, rows, g, 0, a.n_kv, nullptr);
      }
    });
    return;
  }
  int64_t chunk = (a.n_kv + splits - 1) / splits;
  // A tiled cache is read in whole tiles: key ranges start at multiples of its blocks.
  if (amx && a.k.tiled != 0) chunk = (chunk + 127) / 128 * 128;
  else chunk = (chunk + kKeyBlock - 1) / kKeyBlock * kKeyBlock;  // whole blocks (out of tiles: whole groups)
  const int64_t NQ = R * G;
  const int64_t per = NQ * (a.D + 2);  // per (unit, split): NQ maxima, NQ sums, NQ * D sums
  std::vector<float> part(static_cast<size_t>(units * splits * per));
  executorch::extension::parallel_for(0, units * splits, 1, [&](int64_t w0, int64_t w1) {
    TileRunner run(a, R, amx);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t c = w % splits;
      int64_t b, i0, rows, g;
      unit(w / splits, &b, &i0, &rows, &g);
      float* base = part.data() + w * per;
      Partial pt{base, base + NQ, base + 2 * NQ};
      std::fill(base, base + NQ, -INFINITY);
      std::fill(base + NQ, base + 2 * NQ, 0.f);
      run.run(b, i0, rows, g, c * chunk, std::min(a.n_kv, (c + 1) * chunk), &pt);
    }
  });
  for (int64_t u = 0; u < units; ++u) {
    int64_t b, i0, rows, g;
    unit(u, &b, &i0, &rows, &g);
    for (int64_t t = 0; t < rows * G; ++t) {
      const int64_t r = t / G, h = t % G;
      merge_partials(part.data() + u * splits * per, splits, per, NQ, t, a.D,
                     a.o + b * a.o_sb + (i0 + r) * a.o_ss + (g * G + h) * a.o_sh);
    }
  }
}

}  // namespace etserve
