// Intel AMX tile configuration, shared by the files built with AMX enabled (attention_amx.cpp,
// linear_q4_amx.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace etserve {

// Palette 1: tile t has rows[t] rows of colsb[t] bytes (tiles 0-7).
inline void load_tiles(const uint8_t rows[8], const uint16_t colsb[8]) {
  struct alignas(64) {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = rows[t];
    cfg.colsb[t] = colsb[t];
  }
  _tile_loadconfig(&cfg);
}

}  // namespace etserve
