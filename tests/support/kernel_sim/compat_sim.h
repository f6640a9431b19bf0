// The portability layer for the CPU simulator (tests/support/kernel_sim/cuda_runtime.h): the same
// names as csrc/kernels/compat.cuh and csrc/hip/compat_hip.h, with MF_WARP_SIZE from -D.
#pragma once

#include <cuda_runtime.h>

namespace mf {

constexpr int kWarpSize = MF_WARP_SIZE;
using half_t = _Float16;
struct alignas(2) bf16_t {
  uint16_t bits;
};

inline float shfl_xor(float v, int lane_mask) { return mf_sim::shfl_xor(v, lane_mask); }
inline float to_float(half_t v) { return static_cast<float>(v); }
inline float to_float(bf16_t v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline half_t half_from_float(float v) { return static_cast<half_t>(v); }
inline bf16_t bf16_from_float(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

}  // namespace mf
