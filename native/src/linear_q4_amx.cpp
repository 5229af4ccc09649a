// linear_q4's prefill panels on AMX-INT8: see linear_q4_amx.h. Compiled with AMX and AVX-512
// enabled (native/Makefile); runs only where linear_q4_amx_enabled() (linear_q4.cpp, built for
// the baseline CPU like that check has to be) said the CPU has them.
#include "linear_q4_amx.h"

#include "isa.h"

#if defined(ETS_WITH_AMX)
#include "amx_tiles.h"

#include <immintrin.h>

namespace etserve {

namespace {

// Tiles 0-3: the int32 sums of four groups (16 rows x 16 features); 4, 5: activations (16 rows
// x one group's 32 bytes); 6, 7: weights (8 quads of inputs x 16 features x 4 bytes).
void load_config() {
  const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 8, 8};
  const uint16_t colsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
  load_tiles(rows, colsb);
}

}  // namespace

void q4_panel_amx(const uint8_t* XU, int64_t M, int64_t K, const int8_t* pw, const float* ps, float* sums) {
  const int64_t G = K / 32;
  // The products of four groups at a time, stored as int32 for the vector unit; two such
  // buffers, so that the next four groups' tile work is issued before this four's stores are
  // read back (their lines have arrived by then).
  alignas(64) int32_t c[2][4][16 * 16];
  load_config();
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const uint8_t* a = XU + m0 * K;
    // Groups g.. (at most four) into c[buf] (tile numbers are immediates).
    auto issue = [&](int64_t g, int buf) {
      const int64_t n = G - g < 4 ? G - g : 4;
      _tile_zero(0);
      _tile_loadd(4, a + g * 32, K);
      _tile_loadd(6, pw + g * 512, 64);
      _tile_dpbusd(0, 4, 6);
      if (n > 1) {
        _tile_zero(1);
        _tile_loadd(5, a + (g + 1) * 32, K);
        _tile_loadd(7, pw + (g + 1) * 512, 64);
        _tile_dpbusd(1, 5, 7);
      }
      if (n > 2) {
        _tile_zero(2);
        _tile_loadd(4, a + (g + 2) * 32, K);
        _tile_loadd(6, pw + (g + 2) * 512, 64);
        _tile_dpbusd(2, 4, 6);
      }
      if (n > 3) {
        _tile_zero(3);
        _tile_loadd(5, a + (g + 3) * 32, K);
        _tile_loadd(7, pw + (g + 3) * 512, 64);
        _tile_dpbusd(3, 5, 7);
      }
      _tile_stored(0, c[buf][0], 64);
      if (n > 1) _tile_stored(1, c[buf][1], 64);
      if (n > 2) _tile_stored(2, c[buf][2], 64);
      if (n > 3) _tile_stored(3, c[buf][3], 64);
    };
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
    issue(0, 0);
    for (int64_t g = 0; g < G; g += 4) {
      const int buf = static_cast<int>(g / 4) & 1;
      if (g + 4 < G) issue(g + 4, buf ^ 1);
      const int64_t n = G - g < 4 ? G - g : 4;
      for (int64_t i = 0; i < n; ++i) {
        const __m512 s = _mm512_load_ps(ps + (g + i) * 16);
        const int32_t* ci = c[buf][i];
        for (int r = 0; r < 16; ++r)
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ci + r * 16)), s, acc[r]);
      }
    }
    for (int r = 0; r < 16; ++r) _mm512_store_ps(sums + (m0 + r) * 16, acc[r]);
  }
  _tile_release();
}

}  // namespace etserve

#else  // no AMX in this kernel set: never called (linear_q4_amx_enabled() is false)

#include <cstdlib>

namespace etserve {

void q4_panel_amx(const uint8_t*, int64_t, int64_t, const int8_t*, const float*, float*) { std::abort(); }

}  // namespace etserve

#endif  // ETS_WITH_AMX
