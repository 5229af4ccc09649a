// etserve::linear_q4: a linear layer with 4-bit weights in groups of 32 and
// activations quantized to 8 bits per row when it runs (torchao's 8da4w
// semantics), computed with integer dot products. The exporter
// (app/models/linear_q4.py) writes the weights packed for it; XNNPACK's own
// kernels for the same layer (qd8-f32-qb4w) are bound by compute on AVX2
// hosts (no VNNI), where this one reads the weights at memory speed.
//
//   linear_q4.out(Tensor input, Tensor weight, Tensor scales, Tensor row_sums,
//                 Tensor? bias, *, Tensor(a!) out) -> Tensor(a!)
//
//   input    float [..., K]                  K a multiple of 32
//   weight   uint8 [N, K / 2]                N a multiple of 4; rows interleaved four at a
//                                            time: group g of row 4b + r is the 16 bytes at
//                                            ((b * K/32 + g) * 4 + r) * 16, byte j =
//                                            (w[32g + j] + 8) | (w[32g + j + 16] + 8) << 4,
//                                            w in [-8, 7]
//   scales   int16 [N, K / 32]               float16 bits, same order (element
//                                            (b * K/32 + g) * 4 + r); w * scale is the weight
//   row_sums float [N]                       sum over g of scales[n, g] * sum of group g's w
//   bias     float [N] or None
//   out      float [..., N]                  resized to input's shape with K -> N
//
// Each input row is quantized asymmetrically to int8 as torchao's per-token
// quantization does (scale = (max(x, 0) - min(x, 0)) / 255, zero point
// -128 - round(min / scale), q = clamp(round(x / scale) + zp, -128, 127)), then
//   out[m, n] = scale_m * sum_i w[n, i] * (q[m, i] - zp_m) * scales[n, i / 32] + bias[n],
// evaluated as scale_m * (sum_g scales[n, g] * D_g - (128 + zp_m) * row_sums[n])
// with D_g = sum over the group of w * (q + 128), exact in int32.
#pragma once

#include <executorch/runtime/kernel/kernel_includes.h>

#include <cstdint>
#include <optional>

namespace etserve {

using executorch::aten::Tensor;
using executorch::runtime::KernelRuntimeContext;

constexpr int64_t kQ4Group = 32;

Tensor& linear_q4_out(KernelRuntimeContext& ctx, const Tensor& input, const Tensor& weight,
                      const Tensor& scales, const Tensor& row_sums,
                      const std::optional<Tensor>& bias, Tensor& out);

// The raw kernel: x [M, K] row-major, out [M, N] row-major (bias may be null).
// Threads over N with ExecuTorch's thread pool.
void linear_q4(const float* x, int64_t M, int64_t K, const uint8_t* weight,
               const uint16_t* scales, const float* row_sums, const float* bias, int64_t N,
               float* out);

}  // namespace etserve
