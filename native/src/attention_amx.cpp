// AMX attention tile over an int8 KV cache: see attention_amx.h.
//
// Compiled with AMX and AVX-512 enabled (native/Makefile); nothing here runs
// unless amx_attention_supported() (attention.cpp) said the CPU has them.
//
// Scores: the raw int8 queries (15 per A block, then a row of ones whose
// products are the key sums) against the raw int8 keys, int32 sums:
//   q.k = sq sk (Q.K - zk sum(Q) - zq sum(K) + 64 zq zk), exact in integers.
// The keys come as B tiles: quads of dims x 16 keys, either straight out of a
// cache kept in that layout (kv_layout.h: a model's caches while this kernel
// runs) or transposed from rows into a block buffer (caches in rows).
//
// Weighted sums, per block of 128 keys:
// - over tiled caches (a model's, decode and prefill; A blocks of at most 8
//   query vectors): P' = P * value scale
//   in 16-bit fixed point relative to the row's largest in the block, two
//   unsigned digits stacked in one A tile, against the raw int8 value tiles
//   (AMX-INT8), combined exactly in int32 with the zero-point term: nothing of
//   the cache is converted at all (attend_block_decode);
// - over caches in rows (the kernels' tests): the values converted once per
//   block to bf16 key pairs for every A block of the tile, P' split into bf16
//   hi + lo, fp32 sums (AMX-BF16), the zero points subtracted after.
// A block is converted (or prefetched, tiled) during the previous one, so
// the stores have retired (the lines arrived) when the tiles load them.
#include "attention_amx.h"

#include "attention.h"
#include "isa.h"

#if defined(ETS_WITH_AMX)
#include "amx_tiles.h"
#include "simd.h"

#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(ETS_WITH_AMX)

namespace etserve {

namespace {

constexpr int kD = 64;   // head dim handled
constexpr int kKB = 128;          // keys per block
constexpr int kG16 = kKB / 16;    // 16-key groups of a block (score tiles)
constexpr int kC32 = kKB / 32;    // 32-key chunks of a block (probability tiles)
constexpr int kM = 16;            // tile rows of an A block:
constexpr int kMq = 15;           // up to 15 query vectors, then a row of ones (the key sums)

// Tiles 0-5: m rows (query vectors) x 64 bytes, the A operands and results;
// 6, 7: 16 rows x 64 bytes, the B operands (keys, values).
void load_tile_config(int m) {
  const uint8_t r = static_cast<uint8_t>(m);
  const uint8_t rows[8] = {r, r, r, r, r, r, 16, 16};
  const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  load_tiles(rows, colsb);
}

using simd::exp512;

// 32 floats (a: the first 16, b: the next 16) as bf16, in order.
inline __m512i to_bf16(__m512 a, __m512 b) { return (__m512i)_mm512_cvtne2ps_pbh(b, a); }

// The fp32 value of 16 bf16.
inline __m512 from_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// x = hi + lo, each 32 values in bf16 (x0: the first 16, x1: the next 16).
inline void split_bf16(__m512 x0, __m512 x1, __m512i* hi, __m512i* lo) {
  const __m512i h = to_bf16(x0, x1);
  const __m512 d0 = _mm512_sub_ps(x0, from_bf16(_mm512_castsi512_si256(h)));
  const __m512 d1 = _mm512_sub_ps(x1, from_bf16(_mm512_extracti64x4_epi64(h, 1)));
  *hi = h;
  *lo = to_bf16(d0, d1);
}

// 64 int8 as bf16 (exact): dims 0-31, 32-63.
inline void int8_row_bf16(const int8_t* x, __m512i* d0, __m512i* d1) {
  __m512 f[4];
  for (int c = 0; c < 4; ++c)
    f[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16 * c))));
  *d0 = to_bf16(f[0], f[1]);
  *d1 = to_bf16(f[2], f[3]);
}

// In-register transpose of a 16 x 16 matrix of dwords: r[i] lane j -> r[j] lane i.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + e]: rows 4g..4g+3, element 4L+e in 128-bit lane L.
  for (int g = 0; g < 4; ++g) {
    const __m512i* tg = t + 4 * g;
    u[4 * g + 0] = _mm512_unpacklo_epi64(tg[0], tg[2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(tg[0], tg[2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(tg[1], tg[3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(tg[1], tg[3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i v01 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88);
    const __m512i v23 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xDD);
    const __m512i w01 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
    const __m512i w23 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xDD);
    r[e] = _mm512_shuffle_i32x4(v01, w01, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(v23, w23, 0x88);
    r[8 + e] = _mm512_shuffle_i32x4(v01, w01, 0xDD);
    r[12 + e] = _mm512_shuffle_i32x4(v23, w23, 0xDD);
  }
}

// The rows of one (batch, kv head) of an int8 operand from position j0 on: data,
// scales and zero points as plain pointers and strides (kept in registers: the
// tile buffers' vector stores may alias anything, the AttnArgs fields included).
struct RowsI8 {
  const int8_t* x;
  const float* scale;
  const int8_t* zp;
  int64_t xs, ss, zs;
  RowsI8(const AttnOperand& o, int64_t b, int64_t h, int64_t j0)
      : x(o.i8 + b * o.sb + h * o.sh + j0 * o.ss),
        scale(o.scale + b * o.sc_sb + h * o.sc_sh + j0 * o.sc_ss),
        zp(o.zero_point + b * o.zp_sb + h * o.zp_sh + j0 * o.zp_ss),
        xs(o.ss), ss(o.sc_ss), zs(o.zp_ss) {}
  const int8_t* row(int64_t j) const { return x + j * xs; }

  // Scales and zero points (as floats) of rows j..j+15, zero past j + n.
  void params16(int64_t j, int64_t n, float* sdst, float* zdst) const {
    n = std::max<int64_t>(n, 0);
    const __mmask16 live = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    if (ss == 1) {
      _mm512_store_ps(sdst, _mm512_maskz_loadu_ps(live, scale + j));
    } else if (ss == 2) {  // two kv heads interleaved: the even floats of two vectors
      const int64_t span = n > 0 ? 2 * std::min<int64_t>(n, 16) - 1 : 0;
      const __mmask16 m0 = span >= 16 ? __mmask16(0xffff) : __mmask16((1u << span) - 1u);
      const __mmask16 m1 = span >= 32 ? __mmask16(0xffff) : span > 16 ? __mmask16((1u << (span - 16)) - 1u) : __mmask16(0);
      const __m512 lo = _mm512_maskz_loadu_ps(m0, scale + 2 * j);
      const __m512 hi = _mm512_maskz_loadu_ps(m1, scale + 2 * j + 16);
      _mm512_store_ps(sdst, _mm512_maskz_permutex2var_ps(live, lo, _mm512_slli_epi32(lane, 1), hi));
    } else {
      const __m512i idx = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(ss)));
      _mm512_store_ps(sdst, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, idx, scale + j * ss, 4));
    }
    if (zs <= 4) {  // the 16 bytes lie within 64: one masked load, then compacted
      const int64_t span = n > 0 ? (std::min<int64_t>(n, 16) - 1) * zs + 1 : 0;
      const __mmask64 bytes = span >= 64 ? ~__mmask64(0) : ((__mmask64(1) << span) - 1);
      const __m512i raw = _mm512_maskz_loadu_epi8(bytes, zp + j * zs);
      const __m512i pick = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(zs)));
      // byte n*zs of raw into byte n: vpermb with index bytes n*zs (the dword lanes' low bytes)
      const __m512i idx8 = _mm512_zextsi128_si512(_mm512_cvtepi32_epi8(pick));
      const __m128i z = _mm512_castsi512_si128(_mm512_permutexvar_epi8(idx8, raw));
      _mm512_store_ps(zdst, _mm512_maskz_mov_ps(live, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(z))));
    } else {
      for (int64_t i = 0; i < 16; ++i) zdst[i] = i < n ? static_cast<float>(zp[(j + i) * zs]) : 0.f;
    }
  }
};

}  // namespace

// One block of keys and values, converted for the tiles.
struct KVBlock {
  uint32_t* bk;  // [kG16][16 dim quads][16 keys]: raw int8 keys
  uint16_t* bv;  // [kC32][4 dim groups][16 key pairs][16 dims x 2]
  float* sk;     // [kKB] key scales
  float* zk;     // [kKB] key zero points
  float* sv;     // [kKB] value scales
  float* zv;     // [kKB] value zero points
};

struct AmxScratch {
  int64_t nq_pad = 0;
  // All 64-byte aligned, in one allocation.
  int8_t* qd;       // [A blocks][16][64]: the raw int8 queries of each A block, then a row of ones
  float* qs;        // [nq_pad] query scale times the softmax scale
  int32_t* qsum;    // [nq_pad] the sum of the raw query
  int32_t* qz;      // [nq_pad] the query's zero point
  float* acc;       // [nq_pad][64]
  float* m;         // [nq_pad]
  float* l;         // [nq_pad]
  KVBlock blk[2];   // the block being attended and the next, being converted
  int32_t* sd;      // [16][kKB] integer dot products Q K^T (A block rows)
  float* s;         // [16][kKB] scores, then
  uint16_t* phi;    // [16][kKB] probabilities times value scales, hi
  uint16_t* plo;    // [16][kKB] and lo
  float* ob;        // [16][64] the block's weighted sums
  // decode over tiled caches (kv_layout.h): P' in 16-bit fixed point per row, as two digits
  int8_t* pd;       // [2 chunks][16 rows: 8 per digit][64 keys]
  int32_t* od;      // [16][64] their integer weighted sums
  float* pu;        // [16] the fixed point's unit per row
  int32_t* czi;     // [16] sum of P' (fixed point) * value zero point, exact
  float* cz;        // [16] per row of the A block: sum of P' * zero point, for the raw values
  float* corr;      // [16]
  int64_t* lim;     // [rows]
  void* mem = nullptr;
};

AmxScratch* amx_scratch_new(int64_t rows, int64_t G) {
  auto* s = new (std::nothrow) AmxScratch;
  if (s == nullptr) return nullptr;
  const int64_t nq = rows * G;
  // A blocks of kMq query vectors, or of kDecodeRows over tiled caches; and 16 more, as the
  // tiled path reads the running maxima of an A block's 16 rows at once
  s->nq_pad = std::max((nq + kMq - 1) / kMq * kM, ((nq + 7) / 8 + 1) * kM);
  const size_t np = size_t(s->nq_pad);
  const size_t sizes[] = {np * kD, np * 4, np * 4, np * kD * 4, np * 4, np * 4,
                          size_t(kG16) * 256 * 4, size_t(kC32) * 4 * 512 * 2,
                          size_t(kG16) * 256 * 4, size_t(kC32) * 4 * 512 * 2,
                          3 * 16 * kKB * 4, 16 * kKB * 4, 16 * kKB * 2, 16 * kKB * 2, 16 * kD * 4,
                          kKB * 4, kKB * 4, kKB * 4, kKB * 4, kKB * 4, kKB * 4, kKB * 4, kKB * 4,
                          16 * 4, 16 * 4,
                          size_t(rows) * 8,
                          2 * 16 * 64, 16 * kD * 4, 16 * 4, 16 * 4, np * 4};
  void** slots[] = {reinterpret_cast<void**>(&s->qd),   reinterpret_cast<void**>(&s->qs),
                    reinterpret_cast<void**>(&s->qsum), reinterpret_cast<void**>(&s->acc),
                    reinterpret_cast<void**>(&s->m),    reinterpret_cast<void**>(&s->l),
                    reinterpret_cast<void**>(&s->blk[0].bk), reinterpret_cast<void**>(&s->blk[0].bv),
                    reinterpret_cast<void**>(&s->blk[1].bk), reinterpret_cast<void**>(&s->blk[1].bv),
                    reinterpret_cast<void**>(&s->sd),
                    reinterpret_cast<void**>(&s->s),    reinterpret_cast<void**>(&s->phi),
                    reinterpret_cast<void**>(&s->plo),  reinterpret_cast<void**>(&s->ob),
                    reinterpret_cast<void**>(&s->blk[0].sk), reinterpret_cast<void**>(&s->blk[0].zk),
                    reinterpret_cast<void**>(&s->blk[0].sv), reinterpret_cast<void**>(&s->blk[0].zv),
                    reinterpret_cast<void**>(&s->blk[1].sk), reinterpret_cast<void**>(&s->blk[1].zk),
                    reinterpret_cast<void**>(&s->blk[1].sv), reinterpret_cast<void**>(&s->blk[1].zv),
                    reinterpret_cast<void**>(&s->cz),
                    reinterpret_cast<void**>(&s->corr), 
                    reinterpret_cast<void**>(&s->lim),
                    reinterpret_cast<void**>(&s->pd),   reinterpret_cast<void**>(&s->od),
                    reinterpret_cast<void**>(&s->pu),   reinterpret_cast<void**>(&s->czi),
                    reinterpret_cast<void**>(&s->qz)};
  static_assert(sizeof(sizes) / sizeof(sizes[0]) == sizeof(slots) / sizeof(slots[0]), "");
  size_t total = 0;
  for (size_t z : sizes) total += (z + 63) / 64 * 64;
  char* p = static_cast<char*>(std::aligned_alloc(64, total));
  if (p == nullptr) {
    delete s;
    return nullptr;
  }
  std::memset(p, 0, total);
  s->mem = p;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    *slots[i] = p;
    p += (sizes[i] + 63) / 64 * 64;
  }
  return s;
}

void amx_scratch_free(AmxScratch* s) {
  if (s == nullptr) return;
  std::free(s->mem);
  delete s;
}

bool amx_attention_applies(const AttnArgs& a) {
  return a.D == kD && a.q.i8 != nullptr && a.k.i8 != nullptr && a.v.i8 != nullptr;
}

namespace {

// Tile operands straight out of tiled caches (kv_layout.h), batch 0: the
// 16 keys from position p (a multiple of 16), 16 rows of 64 bytes, stride 64;
// the values of the 64 keys from p (a multiple of 64), dims 16 dg.., 16 rows
// of 64 bytes, stride 256.
inline const int8_t* key_tile(const AttnArgs& a, int64_t g, int64_t p) {
  return a.k.i8 + ((p >> 6) * a.k.hkv + g) * 4096 + ((p >> 4) & 3) * 1024;
}
inline const int8_t* value_tile(const AttnArgs& a, int64_t g, int64_t p, int dg) {
  return a.v.i8 + ((p >> 6) * a.v.hkv + g) * 4096 + dg * 64;
}

// Converts keys [jb, jb + len) of (b, g) and their values into `kb`, the
// groups and chunks that hold them; positions past len
// in those are zero.
void convert_block(const AttnArgs& a, int64_t b, int64_t g, int64_t jb, int64_t len,
                   const KVBlock& kb, bool bf16_values) {
  const RowsI8 K(a.k, b, g, jb), V(a.v, b, g, jb);
  float* const sk = kb.sk;
  float* const zk = kb.zk;
  float* const sv = kb.sv;
  float* const zv = kb.zv;
  uint32_t* const bk = kb.bk;
  uint16_t* const bv = kb.bv;
  if (a.k.tiled != 0) {  // the caches are the tiles already: their parameters only,
    for (int64_t j = 0; j < len; j += 16) {
      K.params16(j, len - j, sk + j, zk + j);
      V.params16(j, len - j, sv + j, zv + j);
    }
    if (!bf16_values) return;
    // and for many query vectors (prefill) the values as bf16 key pairs (as
    // below): a quad of keys holds two pairs, the low and high halves of its
    // dwords. Keys past len are whatever the cache holds: their
    // probabilities are zero.
    for (int64_t c = 0; c * 32 < len; ++c) {
      for (int64_t q = 0; q < 8; ++q) {  // the chunk's key quads
        const int8_t* src = value_tile(a, g, jb + 32 * c + 4 * q, 0) + ((32 * (c % 2) + 4 * q) % 64 / 4) * 256;
        for (int dg = 0; dg < 4; ++dg) {
          const __m512i x = _mm512_loadu_si512(src + 64 * dg);
          uint16_t* dst = bv + c * 4 * 512 + dg * 512 + 2 * q * 32;
          for (int half = 0; half < 2; ++half) {
            const __m256i pairs = _mm512_cvtepi32_epi16(half == 0 ? x : _mm512_srli_epi32(x, 16));
            const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(pairs)));
            const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(pairs, 1)));
            _mm512_store_si512(dst + half * 32, to_bf16(f0, f1));
          }
        }
      }
    }
    return;
  }
  // B operand of S = Q K^T (int8): tile per 16-key group, row r = dims
  // 4r..4r+3, column n = key n of the group: the raw rows, transposed dword-wise.
  for (int64_t grp = 0; grp * 16 < len; ++grp) {
    __m512i k[16];
    for (int64_t n = 0; n < 16; ++n) {
      const int64_t j = grp * 16 + n;
      k[n] = j < len ? _mm512_loadu_si512(K.row(j)) : _mm512_setzero_si512();
    }
    K.params16(grp * 16, len - grp * 16, sk + grp * 16, zk + grp * 16);
    transpose16(k);
    uint32_t* dst = bk + grp * 256;
    for (int i = 0; i < 16; ++i) _mm512_store_si512(dst + 16 * i, k[i]);
  }
  // B operand of O = P V: tile (32-key chunk, dim group dg), row r = keys
  // (2r, 2r+1) of the chunk, column n = dim 16 dg + n, the two keys' values
  // adjacent. Raw values: the zero points are subtracted after (sc->cz).
  alignas(64) static const uint16_t kIdx[2][32] = {
      {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
      {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
  const __m512i idx_lo = _mm512_load_si512(kIdx[0]);
  const __m512i idx_hi = _mm512_load_si512(kIdx[1]);
  for (int64_t c = 0; c * 32 < len; ++c) {
    V.params16(c * 32, len - c * 32, sv + c * 32, zv + c * 32);
    V.params16(c * 32 + 16, len - c * 32 - 16, sv + c * 32 + 16, zv + c * 32 + 16);
    for (int64_t r = 0; r < 16; ++r) {
      __m512i a0[2], a1[2];  // keys 2r and 2r+1 of the chunk: dims 0-31, 32-63
      for (int e = 0; e < 2; ++e) {
        const int64_t j = c * 32 + 2 * r + e;
        __m512i* d = e == 0 ? a0 : a1;
        if (j < len) {
          int8_row_bf16(V.row(j), &d[0], &d[1]);
        } else {
          d[0] = d[1] = _mm512_setzero_si512();
        }
      }
      uint16_t* dst = bv + c * 4 * 512 + r * 32;
      _mm512_store_si512(dst + 0 * 512, _mm512_permutex2var_epi16(a0[0], idx_lo, a1[0]));
      _mm512_store_si512(dst + 1 * 512, _mm512_permutex2var_epi16(a0[0], idx_hi, a1[0]));
      _mm512_store_si512(dst + 2 * 512, _mm512_permutex2var_epi16(a0[1], idx_lo, a1[1]));
      _mm512_store_si512(dst + 3 * 512, _mm512_permutex2var_epi16(a0[1], idx_hi, a1[1]));
    }
  }
}

// Scores of keys 16v.. of the block for query vector t, A block row i:
// q.k = (Q - zq)(K - zk) sq sk over the raw int8 Q K^T (sc->sd row i) and the
// key sums (row `ones`), exact in int32, times the scales and the softmax scale.
inline __m512 scores16(const AmxScratch* sc, const KVBlock& kb, int64_t i, int64_t ones, int64_t t,
                       int64_t v) {
  const __m512i zk = _mm512_cvtps_epi32(_mm512_load_ps(kb.zk + 16 * v));
  const __m512i qsum = _mm512_set1_epi32(sc->qsum[t]), qz = _mm512_set1_epi32(sc->qz[t]);
  __m512i x = _mm512_load_si512(sc->sd + i * kKB + 16 * v);
  x = _mm512_sub_epi32(x, _mm512_mullo_epi32(zk, qsum));
  x = _mm512_sub_epi32(x, _mm512_mullo_epi32(qz, _mm512_load_si512(sc->sd + ones * kKB + 16 * v)));
  x = _mm512_add_epi32(x, _mm512_mullo_epi32(zk, _mm512_slli_epi32(qz, 6)));  // + D zq zk
  return _mm512_mul_ps(_mm512_cvtepi32_ps(x),
                       _mm512_mul_ps(_mm512_load_ps(kb.sk + 16 * v), _mm512_set1_ps(sc->qs[t])));
}

// The scores of row i of the A block (query vector t) over the block's first
// `vis` keys into srow (-inf past them), the mask added; returns their max.
float scores_row(const AmxScratch* sc, const KVBlock& kb, int64_t i, int64_t ones, int64_t t,
                 int64_t vis, const float* mrow, float* srow) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 mx = ninf;
  for (int64_t v = 0; v * 16 < vis; ++v) {
    const int64_t rest = vis - 16 * v;
    const __mmask16 k = rest >= 16 ? __mmask16(0xffff) : __mmask16((1u << rest) - 1u);
    __m512 x = scores16(sc, kb, i, ones, t, v);
    if (mrow) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, mrow + 16 * v));
    x = _mm512_mask_mov_ps(ninf, k, x);
    _mm512_store_ps(srow + 16 * v, x);
    mx = _mm512_max_ps(mx, x);
  }
  return _mm512_reduce_max_ps(mx);
}

// scores_row, then query vector t's new running max *mn and the correction
// *corr of what it had; false when no key so far is visible to it.
bool new_max(const AmxScratch* sc, const KVBlock& kb, int64_t i, int64_t ones, int64_t t,
             int64_t vis, const float* mrow, float* srow, float* mn, float* corr) {
  if (vis == 0) return false;
  const float mo = sc->m[t];
  *mn = std::max(mo, scores_row(sc, kb, i, ones, t, vis, mrow, srow));
  if (!(*mn > -INFINITY)) return false;  // everything so far masked out
  *corr = mo > -INFINITY ? std::exp(mo - *mn) : 0.f;
  return true;
}

// Row i of the A block: scores (sc->s) -> probabilities times value scales as
// bf16 hi + lo over `chunks` 32-key chunks (zero past `vis` keys); updates the
// running max and sum of query vector t; returns the correction of its
// previous accumulators.
float softmax_row(const AttnArgs& a, AmxScratch* sc, const KVBlock& kb, int64_t i, int64_t ones,
                  int64_t t, int64_t vis, int64_t chunks, const float* mrow) {
  float* srow = sc->s + i * kKB;
  uint16_t* ph = sc->phi + i * kKB;
  uint16_t* pl = sc->plo + i * kKB;
  auto zero_from = [&](int64_t c0) {
    for (int64_t c = c0; c < chunks; ++c) {
      _mm512_store_si512(ph + 32 * c, _mm512_setzero_si512());
      _mm512_store_si512(pl + 32 * c, _mm512_setzero_si512());
    }
  };
  sc->cz[i] = 0.f;
  float mn, corr;
  if (!new_max(sc, kb, i, ones, t, vis, mrow, srow, &mn, &corr)) {
    zero_from(0);
    return 1.f;
  }
  const int64_t nv = (vis + 15) / 16;
  const __m512 vmn = _mm512_set1_ps(mn);
  __m512 sum = _mm512_setzero_ps(), zsum = _mm512_setzero_ps();
  const int64_t nc = (nv + 1) / 2;
  for (int64_t c = 0; c < nc; ++c) {
    __m512 pv[2];
    for (int e = 0; e < 2; ++e) {
      const int64_t v = 2 * c + e;
      const int64_t rest = vis - 16 * v;
      if (rest <= 0) {
        pv[e] = _mm512_setzero_ps();
        continue;
      }
      const __mmask16 k = rest >= 16 ? __mmask16(0xffff) : __mmask16((1u << rest) - 1u);
      const __m512 p = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_load_ps(srow + 16 * v), vmn)));
      sum = _mm512_add_ps(sum, p);
      pv[e] = _mm512_mul_ps(p, _mm512_load_ps(kb.sv + 16 * v));
      zsum = _mm512_fmadd_ps(pv[e], _mm512_load_ps(kb.zv + 16 * v), zsum);
    }
    __m512i h, l;
    split_bf16(pv[0], pv[1], &h, &l);
    _mm512_store_si512(ph + 32 * c, h);
    _mm512_store_si512(pl + 32 * c, l);
  }
  zero_from(nc);
  sc->l[t] = sc->l[t] * corr + _mm512_reduce_add_ps(sum);
  sc->m[t] = mn;
  sc->cz[i] = _mm512_reduce_add_ps(zsum);
  return corr;
}

// The cache lines of one block of tiled caches (kv head g, keys from p, a
// multiple of 64), prefetched `n` at a time by next().
struct Prefetch {
  const char* k[2] = {nullptr, nullptr};
  const char* v[2] = {nullptr, nullptr};
  const char* par[4] = {nullptr, nullptr, nullptr, nullptr};  // key, value scales; zero points
  int64_t par_bytes[4] = {0, 0, 0, 0};
  int blocks = 0, line = 0;  // 64 lines per 4 KB of keys and of values, per 64 keys
  void start(const AttnArgs& a, int64_t g, int64_t p, int64_t jmax) {
    blocks = 0;
    line = 0;
    for (int e = 0; e < 2 && p + 64 * e < jmax; ++e) {
      k[e] = reinterpret_cast<const char*>(key_tile(a, g, p + 64 * e));
      v[e] = reinterpret_cast<const char*>(value_tile(a, g, p + 64 * e, 0));
      blocks = e + 1;
    }
    // and the block's scales and zero points (batch 0; the rows of every head)
    const int64_t n = blocks > 0 ? std::min<int64_t>(kKB, jmax - p) : 0;
    const AttnOperand* ops[2] = {&a.k, &a.v};
    for (int e = 0; e < 2; ++e) {
      par[e] = reinterpret_cast<const char*>(ops[e]->scale + p * ops[e]->sc_ss);
      par_bytes[e] = n * ops[e]->sc_ss * 4;
      par[2 + e] = reinterpret_cast<const char*>(ops[e]->zero_point + p * ops[e]->zp_ss);
      par_bytes[2 + e] = n * ops[e]->zp_ss;
    }
  }
  void next(int n) {
    if (line == 0) {  // the parameters first: the block's conversion reads them
      for (int e = 0; e < 4; ++e)
        for (int64_t o = 0; o < par_bytes[e]; o += 64) _mm_prefetch(par[e] + o, _MM_HINT_T1);
    }
    for (; n > 0 && line < 64 * blocks; --n, ++line) {
      const int e = line / 64, o = (line % 64) * 64;
      _mm_prefetch(k[e] + o, _MM_HINT_T1);
      _mm_prefetch(v[e] + o, _MM_HINT_T1);
    }
  }
};

// 2^x for x <= 0 or -inf (-> 2^-126, ~1.2e-38): x = n + f, |f| <= 1/2, the
// degree-6 Taylor polynomial of 2^f (relative error < 1.2e-7), 2^n by vscalefps.
inline __m512 exp2_512(__m512 x) {
  constexpr float c[6] = {1.5403530393381606e-4f, 1.3333558146428443e-3f, 9.6181291076284772e-3f,
                          5.5504108664821580e-2f, 2.4022650695910071e-1f, 6.9314718055994531e-1f};
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(c[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
  return _mm512_scalef_ps(_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f)), n);
}

// Tiled caches (an A block of at most kDecodeRows query vectors, t = t0 + i):
// block jb's softmax and O += P V, the running maxima sc->m in log2 units
// (attend_tile_amx converts them at the end).
// - Scores: x = Q.K - zk sum(Q) - zq sum(K) + 64 zq zk from the int32 tile
//   products (sc->sd) and the key sums (row `rows`), exact in fp32 (every term
//   is an integer below 2^24), times the key scale; the query's scale and
//   log2(e) (alpha) go into the exponent. Every row's scores first (pass 1),
//   then every row's maximum and corrections at once, then the digits (pass 2):
//   the rows' chains overlap.
// - P' = P * value scale in 16-bit fixed point relative to the row's largest in
//   the block, two unsigned digits (rounding: up to 2^-17 of that largest per
//   key). Digit e of row i is row 8e + i of the A tile of its 64-key chunk:
//   one TDPBUSD per chunk and 16 dims gives both digits' int32 sums against the
//   raw int8 value tiles, 8 per block.
// - sum(Q (v - zv)) = o0 + 256 o1 - sum(Q zv) is exact in int32 (|.| < 128 *
//   65535 * 255 < 2^31), then scaled by the unit into the fp32 accumulators.
constexpr int64_t kDecodeRows = 8;

// The per-block key terms of decode_row.
struct DecodeKeys {
  alignas(64) float ksum[kKB];  // the key sums (exact)
  alignas(64) int32_t zv[kKB];  // value zero points
};

// Row i of the A block over the block's first `vis` keys (kFull: all kKB of
// them, no mask), pass 1: its scores before alpha into sc->s (-inf past vis);
// returns their largest times alpha (-inf: nothing visible).
template <bool kFull>
inline float decode_scores(AmxScratch* sc, const KVBlock& kb, const DecodeKeys& dk, int64_t i, int64_t t,
                           int64_t vis, const float* mrow) {
  constexpr int64_t kV = kKB / 16;
  const int64_t nv = kFull ? kV : (vis + 15) / 16;
  const __m512 zq = _mm512_set1_ps(static_cast<float>(sc->qz[t]));
  const __m512 c = _mm512_set1_ps(static_cast<float>(sc->qsum[t] - 64 * sc->qz[t]));
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  float* x = sc->s + i * kKB;
  __m512 mx = ninf;
#pragma GCC unroll 8
  for (int64_t v = 0; v < kV; ++v) {
    if (!kFull && v >= nv) break;
    __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(sc->sd + i * kKB + 16 * v));
    s = _mm512_fnmadd_ps(zq, _mm512_load_ps(dk.ksum + 16 * v), s);
    s = _mm512_fnmadd_ps(_mm512_load_ps(kb.zk + 16 * v), c, s);
    s = _mm512_mul_ps(s, _mm512_load_ps(kb.sk + 16 * v));
    if (!kFull) {
      const int64_t rest = vis - 16 * v;
      const __mmask16 k = rest >= 16 ? __mmask16(0xffff) : __mmask16((1u << rest) - 1u);
      // the additive mask is in the scores' units: divided by the query's scale
      if (mrow) s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, mrow + 16 * v), _mm512_set1_ps(1.f / sc->qs[t]), s);
      s = _mm512_mask_mov_ps(ninf, k, s);
    }
    _mm512_store_ps(x + 16 * v, s);
    mx = _mm512_max_ps(mx, s);
  }
  return _mm512_reduce_max_ps(mx) * (sc->qs[t] * 1.44269504088896341f);
}

// Pass 2: P' of row i as digits (see attend_block_decode), 2^(x alpha - bm)
// summed into *sum, sum(Q zv) into *czi; returns the unit of Q before the
// block's scale against the row's maximum.
template <bool kFull>
inline float decode_probs(AmxScratch* sc, const KVBlock& kb, const DecodeKeys& dk, int64_t i, int64_t t,
                          int64_t vis, int64_t chunks, float bm, float* sum, int32_t* czi) {
  constexpr int64_t kV = kKB / 16;
  const int64_t nv = kFull ? kV : (vis + 15) / 16;
  const __m512 alpha = _mm512_set1_ps(sc->qs[t] * 1.44269504088896341f), vbm = _mm512_set1_ps(bm);
  float* x = sc->s + i * kKB;
  __m512 acc = _mm512_setzero_ps(), top = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int64_t v = 0; v < kV; ++v) {
    if (!kFull && v >= nv) break;
    const __m512 p = exp2_512(_mm512_fmsub_ps(_mm512_load_ps(x + 16 * v), alpha, vbm));  // <= 1; -inf: ~1e-38
    acc = _mm512_add_ps(acc, p);
    const __m512 pv = _mm512_mul_ps(p, _mm512_load_ps(kb.sv + 16 * v));
    _mm512_store_ps(x + 16 * v, pv);
    top = _mm512_max_ps(top, pv);
  }
  const float tp = _mm512_reduce_max_ps(top);
  const __m512 inv = _mm512_set1_ps(tp > 0.f ? 65535.f / tp : 0.f);
  __m512i cz = _mm512_setzero_si512();
  int8_t* row = sc->pd + i * 64;
#pragma GCC unroll 8
  for (int64_t v = 0; v < kV; ++v) {
    if (!kFull && v >= nv) break;
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x + 16 * v), inv));  // 0..65535
    cz = _mm512_add_epi32(cz, _mm512_mullo_epi32(q, _mm512_load_si512(dk.zv + 16 * v)));
    int8_t* dst = row + (v / 4) * 1024 + (v % 4) * 16;
    _mm_store_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(q));
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + 512), _mm512_cvtepi32_epi8(_mm512_srli_epi32(q, 8)));
  }
  if (!kFull) {
    for (int64_t v = nv; v < 4 * chunks; ++v) {  // keys past vis in the chunks the tiles read
      int8_t* dst = row + (v / 4) * 1024 + (v % 4) * 16;
      _mm_store_si128(reinterpret_cast<__m128i*>(dst), _mm_setzero_si128());
      _mm_store_si128(reinterpret_cast<__m128i*>(dst + 512), _mm_setzero_si128());
    }
  }
  *sum = _mm512_reduce_add_ps(acc);
  *czi = _mm512_reduce_add_epi32(cz);
  return tp / 65535.f;
}

void attend_block_decode(const AttnArgs& a, AmxScratch* sc, const KVBlock& kb, int64_t g,
                         int64_t i0, int64_t t0, int64_t jb, int64_t len, int64_t rows, int64_t G,
                         int64_t vis_max, Prefetch& pf) {
  const int64_t nv_max = (vis_max + 15) / 16, chunks = (vis_max + 63) / 64;
  DecodeKeys dk;
  for (int64_t v = 0; v < nv_max; ++v) {
    _mm512_store_ps(dk.ksum + 16 * v, _mm512_cvtepi32_ps(_mm512_load_si512(sc->sd + rows * kKB + 16 * v)));
    _mm512_store_si512(dk.zv + 16 * v, _mm512_cvtps_epi32(_mm512_load_ps(kb.zv + 16 * v)));
  }
  // Pass 1, every row: the scores and each row's largest.
  alignas(64) float bm[16];
  int64_t vis[kDecodeRows];
  const float* mrow[kDecodeRows];
  bool full = true;
  std::fill(bm, bm + 16, -INFINITY);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = (t0 + i) / G;
    const int64_t n = std::clamp<int64_t>(sc->lim[r] - jb, 0, len);
    mrow[i] = a.mask ? a.mask + (i0 + r) * a.mask_ss + jb : nullptr;
    vis[i] = n;
    full = full && n == kKB && mrow[i] == nullptr;
  }
  for (int64_t i = 0; i < rows; ++i) {
    if (full) {
      bm[i] = decode_scores<true>(sc, kb, dk, i, t0 + i, kKB, nullptr);
    } else if (vis[i] > 0) {
      bm[i] = decode_scores<false>(sc, kb, dk, i, t0 + i, vis[i], mrow[i]);
    }
    pf.next(8);
  }
  // The rows' new maxima, the corrections of what they had, and each block's
  // scale against its row's maximum, 16 rows at once.
  float* m = sc->m + t0;  // this A block's query vectors' state
  float* l = sc->l + t0;
  const __m512 mo = _mm512_loadu_ps(m), vbm = _mm512_load_ps(bm), ninf = _mm512_set1_ps(-INFINITY);
  const __m512 mn = _mm512_max_ps(mo, vbm);
  const __mmask16 had = _mm512_cmp_ps_mask(mo, ninf, _CMP_GT_OQ), sees = _mm512_cmp_ps_mask(vbm, ninf, _CMP_GT_OQ);
  alignas(64) float corr[16], below[16];
  _mm512_store_ps(corr, _mm512_mask_blend_ps(had, _mm512_setzero_ps(), exp2_512(_mm512_sub_ps(mo, mn))));
  _mm512_store_ps(below, _mm512_maskz_mov_ps(sees, exp2_512(_mm512_sub_ps(vbm, mn))));
  // Pass 2, every row that sees a key: the digits.
  for (int64_t i = 0; i < rows; ++i) {
    sc->corr[i] = 1.f;
    sc->pu[i] = 0.f;  // the row's digits (whatever they hold) count for nothing
    sc->czi[i] = 0;
    if (!(bm[i] > -INFINITY)) continue;
    float sum, unit;
    if (full) {
      unit = decode_probs<true>(sc, kb, dk, i, t0 + i, kKB, chunks, bm[i], &sum, &sc->czi[i]);
    } else {
      unit = decode_probs<false>(sc, kb, dk, i, t0 + i, vis[i], chunks, bm[i], &sum, &sc->czi[i]);
    }
    l[i] = l[i] * corr[i] + sum * below[i];
    m[i] = bm[i] > m[i] ? bm[i] : m[i];
    sc->corr[i] = corr[i];
    sc->pu[i] = unit * below[i];
    pf.next(8);
  }
  // Tiles 2, 3: the digits of chunks 0 and 1 (16 rows); 0, 1, 4, 5: the sums
  // for dims 0-15 .. 48-63; 6, 7: the value tiles of the two chunks.
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(4);
  _tile_zero(5);
  _tile_loadd(2, sc->pd, 64);
  if (chunks > 1) _tile_loadd(3, sc->pd + 1024, 64);
  for (int dg = 0; dg < 4; ++dg) {
    _tile_loadd(6, value_tile(a, g, jb, dg), 256);
    switch (dg) {  // tile numbers are immediates
      case 0: _tile_dpbusd(0, 2, 6); break;
      case 1: _tile_dpbusd(1, 2, 6); break;
      case 2: _tile_dpbusd(4, 2, 6); break;
      default: _tile_dpbusd(5, 2, 6); break;
    }
    if (chunks > 1) {
      _tile_loadd(7, value_tile(a, g, jb + 64, dg), 256);
      switch (dg) {
        case 0: _tile_dpbusd(0, 3, 7); break;
        case 1: _tile_dpbusd(1, 3, 7); break;
        case 2: _tile_dpbusd(4, 3, 7); break;
        default: _tile_dpbusd(5, 3, 7); break;
      }
    }
  }
  _tile_stored(0, sc->od + 0, kD * 4);
  _tile_stored(1, sc->od + 16, kD * 4);
  _tile_stored(4, sc->od + 32, kD * 4);
  _tile_stored(5, sc->od + 48, kD * 4);
  pf.next(128);  // the rest
  for (int64_t i = 0; i < rows; ++i) {
    float* acc = sc->acc + (t0 + i) * kD;
    const int32_t* o0 = sc->od + i * kD;
    const int32_t* o1 = sc->od + (8 + i) * kD;
    const __m512 u = _mm512_set1_ps(sc->pu[i]), corr = _mm512_set1_ps(sc->corr[i]);
    const __m512i cz = _mm512_set1_epi32(sc->czi[i]);
    for (int d = 0; d < kD; d += 16) {
      __m512i x = _mm512_add_epi32(_mm512_load_si512(o0 + d), _mm512_slli_epi32(_mm512_load_si512(o1 + d), 8));
      const __m512 o = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(x, cz)), u);
      _mm512_store_ps(acc + d, _mm512_fmadd_ps(_mm512_load_ps(acc + d), corr, o));
    }
  }
}

}  // namespace

void attend_tile_amx(const AttnArgs& a, int64_t b, int64_t i0, int64_t R, int64_t g, int64_t j0,
                     int64_t j1, AmxScratch* sc, float* part_m, float* part_l, float* part_acc) {
  const int64_t G = a.H / a.Hkv, NQ = R * G;
  // Tiled caches: P V in int8 straight from the value tiles, in A blocks of kDecodeRows query
  // vectors (their digits fill a tile's 16 rows); caches in rows: the values converted to bf16
  // once per block for A blocks of kMq.
  const bool tiled = a.k.tiled != 0;  // then a.v.tiled too: the keys need no conversion
  const bool int8_pv = tiled;
  const int64_t mq = int8_pv ? kDecodeRows : kMq;
  const int64_t n_mb = (NQ + mq - 1) / mq;
  // Tile rows: decode stacks its two digits (16); otherwise the query vectors and the ones.
  const int M = int8_pv ? kM : static_cast<int>(std::min<int64_t>(kM, NQ + 1));
  int64_t jmax = j0;
  for (int64_t r = 0; r < R; ++r) {
    int64_t lim = a.n_kv;
    if (a.causal) lim = std::min(lim, a.start_pos + i0 + r + 1);
    sc->lim[r] = std::min(lim, j1);
    jmax = std::max(jmax, sc->lim[r]);
  }
  // The raw int8 queries, 15 per A block, each block's next row all ones (its
  // products are the key sums, for the query zero points); the rest zero.
  for (int64_t mb = 0; mb < n_mb; ++mb) {
    const int64_t t0 = mb * mq, nqb = std::min<int64_t>(mq, NQ - t0);
    int8_t* blk = sc->qd + mb * kM * kD;
    std::memset(blk, 0, kM * kD);
    for (int64_t r = 0; r < nqb; ++r) {
      const int64_t t = t0 + r, s_ = i0 + t / G, h = g * G + t % G;
      const AttnOperand& q = a.q;
      const __m512i raw = _mm512_loadu_si512(q.i8 + b * q.sb + s_ * q.ss + h * q.sh);
      _mm512_store_si512(blk + r * kD, raw);
      // the sum of the 64 signed bytes: of (byte + 128) as unsigned, less 64 * 128
      const __m512i sad = _mm512_sad_epu8(_mm512_xor_si512(raw, _mm512_set1_epi8(-128)), _mm512_setzero_si512());
      sc->qsum[t] = static_cast<int32_t>(_mm512_reduce_add_epi64(sad)) - 64 * 128;
      sc->qz[t] = q.zero_point[b * q.zp_sb + s_ * q.zp_ss + h * q.zp_sh];
      sc->qs[t] = q.scale[b * q.sc_sb + s_ * q.sc_ss + h * q.sc_sh] * a.scale;
    }
    std::memset(blk + nqb * kD, 1, kD);
  }
  std::fill(sc->acc, sc->acc + NQ * kD, 0.f);
  std::fill(sc->m, sc->m + NQ, -INFINITY);
  std::fill(sc->l, sc->l + NQ, 0.f);

  load_tile_config(M);
  for (int64_t jb = j0; jb < jmax; jb += kKB) {
    const int64_t len = std::min<int64_t>(kKB, jmax - jb);
    // This block was converted during the previous one (stores long retired
    // when the tiles load them); the next is converted after this one's scores.
    const KVBlock& kb = sc->blk[((jb - j0) / kKB) % 2];
    if (jb == j0) convert_block(a, b, g, jb, len, kb, !int8_pv);
    // Tiled caches: the key and value tiles of the block after the next are
    // prefetched a few lines at a time through this block's work (all at once,
    // the prefetches would wait for each other and the work behind them).
    Prefetch pf;
    if (tiled) pf.start(a, g, jb + 2 * kKB, jmax);
    bool next_done = jb + kKB >= jmax;
    for (int64_t mb = 0; mb < n_mb; ++mb) {
      const int64_t t0 = mb * mq, rows = std::min<int64_t>(mq, NQ - t0);
      int64_t vis_max = 0;  // keys of the block some row of this A block sees
      for (int64_t i = 0; i < rows; ++i)
        vis_max = std::max(vis_max, std::clamp<int64_t>(sc->lim[(t0 + i) / G] - jb, 0, len));
      if (vis_max == 0) continue;
      const int64_t groups = (vis_max + 15) / 16, chunks = (vis_max + 31) / 32;
      // S = Q K^T in int32, the raw int8 operands. Tile 3: the A block;
      // 0, 1, 2, 4: four 16-key groups' products in flight; 6, 7: key tiles.
      _tile_loadd(3, sc->qd + mb * kM * kD, kD);
      auto key = [&](int64_t grp) {
        return tiled ? static_cast<const void*>(key_tile(a, g, jb + grp * 16))
                     : static_cast<const void*>(kb.bk + grp * 256);
      };
      for (int64_t grp = 0; grp < groups; grp += 4) {
        int32_t* dst = sc->sd + grp * 16;
        const int64_t n = std::min<int64_t>(4, groups - grp);
        _tile_zero(0);
        _tile_loadd(6, key(grp), 64);
        _tile_dpbssd(0, 3, 6);
        if (n > 1) {
          _tile_zero(1);
          _tile_loadd(7, key(grp + 1), 64);
          _tile_dpbssd(1, 3, 7);
        }
        if (n > 2) {
          _tile_zero(2);
          _tile_loadd(6, key(grp + 2), 64);
          _tile_dpbssd(2, 3, 6);
        }
        if (n > 3) {
          _tile_zero(4);
          _tile_loadd(7, key(grp + 3), 64);
          _tile_dpbssd(4, 3, 7);
        }
        _tile_stored(0, dst, kKB * 4);
        if (n > 1) _tile_stored(1, dst + 16, kKB * 4);
        if (n > 2) _tile_stored(2, dst + 32, kKB * 4);
        if (n > 3) _tile_stored(4, dst + 48, kKB * 4);
        pf.next(8);
      }
      if (!next_done) {
        convert_block(a, b, g, jb + kKB, std::min<int64_t>(kKB, jmax - jb - kKB), sc->blk[((jb - j0) / kKB + 1) % 2], !int8_pv);
        next_done = true;
      }
      if (int8_pv) {
        attend_block_decode(a, sc, kb, g, i0, t0, jb, len, rows, G, vis_max, pf);
        continue;
      }
      for (int64_t i = 0; i < M; ++i) {
        const int64_t t = t0 + i;
        const int64_t r = t / G;
        const int64_t vis = i < rows ? std::clamp<int64_t>(sc->lim[r] - jb, 0, len) : 0;
        const float* mrow = a.mask && vis > 0 ? a.mask + (i0 + r) * a.mask_ss + jb : nullptr;
        sc->corr[i] = softmax_row(a, sc, kb, i, rows, t, vis, chunks, mrow);
      }
      // O = P V. Tiles 0-3: the 64 dims; 4, 5: probabilities hi, lo of a
      // 32-key chunk; 6, 7: value tiles.
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < chunks; ++c) {
        const uint16_t* vb = kb.bv + c * 4 * 512;
        _tile_loadd(4, sc->phi + 32 * c, kKB * 2);
        _tile_loadd(5, sc->plo + 32 * c, kKB * 2);
        _tile_loadd(6, vb, 64);
        _tile_loadd(7, vb + 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(0, 5, 6);
        _tile_dpbf16ps(1, 5, 7);
        _tile_loadd(6, vb + 2 * 512, 64);
        _tile_loadd(7, vb + 3 * 512, 64);
        _tile_dpbf16ps(2, 4, 6);
        _tile_dpbf16ps(3, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, sc->ob, kD * 4);
      _tile_stored(1, sc->ob + 16, kD * 4);
      _tile_stored(2, sc->ob + 32, kD * 4);
      _tile_stored(3, sc->ob + 48, kD * 4);
      for (int64_t i = 0; i < rows; ++i) {
        float* acc = sc->acc + (t0 + i) * kD;
        const float* ob = sc->ob + i * kD;
        const __m512 c = _mm512_set1_ps(sc->corr[i]), z = _mm512_set1_ps(sc->cz[i]);
        for (int d = 0; d < kD; d += 16) {
          const __m512 o = _mm512_sub_ps(_mm512_load_ps(ob + d), z);
          _mm512_store_ps(acc + d, _mm512_fmadd_ps(_mm512_load_ps(acc + d), c, o));
        }
      }
    }
    if (!next_done)  // no row of this block saw a key of it
      convert_block(a, b, g, jb + kKB, std::min<int64_t>(kKB, jmax - jb - kKB), sc->blk[((jb - j0) / kKB + 1) % 2], !int8_pv);
  }
  _tile_release();
  if (int8_pv)  // its maxima are in log2 units
    for (int64_t t = 0; t < NQ; ++t) sc->m[t] *= 0.693147180559945309f;

  for (int64_t t = 0; t < NQ; ++t) {
    const float* acc = sc->acc + t * kD;
    if (part_m) {
      part_m[t] = sc->m[t];
      part_l[t] = sc->l[t];
      std::copy(acc, acc + kD, part_acc + t * kD);
      continue;
    }
    const int64_t r = t / G, h = t % G;
    float* dst = a.o + b * a.o_sb + (i0 + r) * a.o_ss + (g * G + h) * a.o_sh;
    const __m512 s = _mm512_set1_ps(sc->l[t] > 0.f ? 1.f / sc->l[t] : 0.f);  // nothing visible: zeros
    for (int d = 0; d < kD; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_load_ps(acc + d), s));
  }
}

}  // namespace etserve

#else  // no AMX in this kernel set (another architecture, or a tier below AVX-512): never called

#include <cstdlib>

namespace etserve {

AmxScratch* amx_scratch_new(int64_t, int64_t) { return nullptr; }
void amx_scratch_free(AmxScratch*) {}
bool amx_attention_applies(const AttnArgs&) { return false; }
void attend_tile_amx(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, AmxScratch*, float*,
                     float*, float*) {
  std::abort();
}

}  // namespace etserve

#endif  // ETS_WITH_AMX
