// Shared device helpers: dtype conversion to and from fp32, vector packs, warp and block reductions.
// All arithmetic happens in fp32; 16-bit types are storage only.
#pragma once

#include "compat.cuh"
#include "launch.h"

namespace mf {

// Blocks hold at most 1024 threads; a block reduction stages one value per warp.
constexpr int kMaxBlock = 1024;
constexpr int kMaxWarps = kMaxBlock / kWarpSize;

__device__ __forceinline__ float to_float(float v) { return v; }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ half_t from_float<half_t>(float v) { return half_from_float(v); }
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float v) { return bf16_from_float(v); }

// N consecutive elements moved as one aligned access (8 or 16 bytes), which is what lets a
// memory-bound kernel approach the bandwidth of HBM on both vendors.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ void load_float(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(pack.v[i]);
}

template <int N, typename T>
__device__ __forceinline__ void store_float(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int lane_mask = kWarpSize / 2; lane_mask > 0; lane_mask >>= 1) {
    v = op(v, shfl_xor(v, lane_mask));
  }
  return v;
}

// Every thread of the block gets the result. blockDim.x must be a multiple of kWarpSize.
// `staging` is a __shared__ float[kMaxWarps]; the leading barrier lets callers reuse it.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity, float* staging) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) staging[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_reduce(lane < warps ? staging[lane] : identity, op);
    if (lane == 0) staging[0] = v;
  }
  __syncthreads();
  return staging[0];
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of a row-per-block kernel loop over rows; the cap keeps gridDim.x * blockDim.x below
// 2^32, which HIP requires (CUDA allows more).
constexpr int64_t kMaxRowBlocks = 1 << 21;

inline bool aligned(const void* p, int64_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace mf
