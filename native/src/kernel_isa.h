// The vector instructions one set of kernels was compiled for (kernel_isa.cpp, built with the
// same flags as the kernels beside it): "avx512-vnni", "avx512", "avx2" or "scalar";
// on aarch64 "neon-dotprod", "neon" or "scalar".
#pragma once

namespace etserve {

const char* kernel_isa();

}  // namespace etserve
