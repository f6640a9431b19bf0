// Portability layer, CUDA side: the warp width, lane shuffles and the 16-bit float types.
//
// Device code names only what this header exports (mf::kWarpSize, mf::shfl_xor, mf::half_t,
// mf::bf16_t, mf::to_float, mf::bf16_from_float), never a vendor intrinsic. tools/hipify_build.py
// replaces this file in the hipified tree with csrc/hip/compat_hip.h, which provides the same
// names for HIP 5.2: that release has no __shfl_xor_sync and no hip/hip_bf16.h, so a plain
// hipify of CUDA code that used them would not compile for MI250X.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#error "compat.cuh is the CUDA side; build HIP from the tree written by tools/hipify_build.py"
#endif

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define MF_WARP_SIZE 32

namespace mf {

constexpr int kWarpSize = MF_WARP_SIZE;
// Every lane of a full warp, derived from the width so that no 32-lane literal reaches a kernel.
constexpr unsigned kFullLaneMask = 0xffffffffu >> (32 - kWarpSize);

using half_t = __half;
// torch's at::BFloat16 and __nv_bfloat16 are both 16 raw bits: the binding passes data pointers.
using bf16_t = __nv_bfloat16;

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
  // Callers keep whole warps converged (block sizes are warp multiples), so the full mask is exact.
  return __shfl_xor_sync(kFullLaneMask, v, lane_mask, kWarpSize);
}

__device__ __forceinline__ float to_float(half_t v) { return __half2float(v); }
__device__ __forceinline__ float to_float(bf16_t v) { return __bfloat162float(v); }
__device__ __forceinline__ half_t half_from_float(float v) { return __float2half_rn(v); }
// One cvt instruction on sm_80+; rounds to nearest even like torch's float -> bfloat16 cast.
__device__ __forceinline__ bf16_t bf16_from_float(float v) { return __float2bfloat16_rn(v); }

}  // namespace mf
