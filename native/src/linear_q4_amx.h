// linear_q4's prefill panels on Intel AMX tiles (linear_q4_amx.cpp).
//
// A panel is 16 output features; linear_q4.cpp unpacks its weights once per call as
// [group][quad of inputs][16 features][4 bytes] (signed, -8..7): per group of 32 inputs that is
// exactly the B operand of TDPBUSD (8 rows of 64 bytes). The activations are rows of unsigned
// bytes (q + 128), row-major: 16 rows of a group are an A operand read in place (stride K).
// Per group the int32 products of 16 rows x 16 features come out of one TDPBUSD, exact, and are
// scaled by the group's 16 scales in fp32, as the AVX-512 panel does it.
#pragma once

#include <cstdint>

namespace etserve {

// True when the panels may use AMX: the CPU and OS allow it (amx_attention_supported) and
// $ETSERVE_LINEAR is not "generic". Checked once.
bool linear_q4_amx_enabled();

// sums[m * 16 + n] = sum over groups g of ps[g * 16 + n] * (sum over the group's 32 inputs i of
// XU[m * K + 32 g + i] * w[n][32 g + i]) for rows m < M (a multiple of 16); pw, ps as above.
void q4_panel_amx(const uint8_t* XU, int64_t M, int64_t K, const int8_t* pw, const float* ps, float* sums);

}  // namespace etserve
