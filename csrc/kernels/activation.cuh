// Elementwise activations of the MLP, forward and backward, fp32 math:
//  - bias + GeLU with the tanh approximation (GPT-2, Megatron): y = gelu(x + bias);
//  - SwiGLU (LLaMA): y = silu(gate) * up.
// Grid-stride loops over VEC-wide packs; the launcher picks VEC = 4 when sizes and pointers allow.
#pragma once

#include <math.h>

#include "common.cuh"

namespace mf {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float v) {
  const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
  return 0.5f * v * (1.0f + t);
}

// d/dv of gelu_tanh: 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 v^2).
__device__ __forceinline__ float gelu_tanh_grad(float v) {
  const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
  return 0.5f * (1.0f + t) +
         0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// Column of flat index i in rows of n; 32-bit division is several times cheaper than 64-bit, and
// these kernels are close to compute bound for 16-bit data on HBM3 parts.
__device__ __forceinline__ int64_t column_of(int64_t i, int64_t n) {
  if (i <= UINT32_MAX && n <= UINT32_MAX) {
    return static_cast<uint32_t>(i) % static_cast<uint32_t>(n);
  }
  return i % n;
}

__device__ __forceinline__ int64_t grid_start(int vec) {
  return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * vec;
}
__device__ __forceinline__ int64_t grid_step(int vec) {
  return static_cast<int64_t>(gridDim.x) * blockDim.x * vec;
}

// bias is fp32 [n] or null; VEC divides n, so a pack never straddles two rows.
template <typename T, int VEC>
__global__ void __launch_bounds__(256)
bias_gelu_forward_kernel(const T* __restrict__ x, const float* __restrict__ bias,
                         T* __restrict__ y, int64_t numel, int64_t n) {
  for (int64_t i = grid_start(VEC); i < numel; i += grid_step(VEC)) {
    float v[VEC];
    load_float<VEC>(x + i, v);
    const float* b = bias ? bias + column_of(i, n) : nullptr;
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = gelu_tanh(v[k] + (b ? b[k] : 0.0f));
    store_float<VEC>(y + i, v);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
bias_gelu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                          const float* __restrict__ bias, T* __restrict__ dx, int64_t numel,
                          int64_t n) {
  for (int64_t i = grid_start(VEC); i < numel; i += grid_step(VEC)) {
    float g[VEC], v[VEC];
    load_float<VEC>(dy + i, g);
    load_float<VEC>(x + i, v);
    const float* b = bias ? bias + column_of(i, n) : nullptr;
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] *= gelu_tanh_grad(v[k] + (b ? b[k] : 0.0f));
    store_float<VEC>(dx + i, g);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y,
                      int64_t numel) {
  for (int64_t i = grid_start(VEC); i < numel; i += grid_step(VEC)) {
    float g[VEC], u[VEC];
    load_float<VEC>(gate + i, g);
    load_float<VEC>(up + i, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];
    store_float<VEC>(y + i, g);
  }
}

// d gate = dy * up * sig(g) * (1 + g * (1 - sig(g))); d up = dy * silu(g).
template <typename T, int VEC>
__global__ void __launch_bounds__(256)
swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ gate,
                       const T* __restrict__ up, T* __restrict__ dgate, T* __restrict__ dup,
                       int64_t numel) {
  for (int64_t i = grid_start(VEC); i < numel; i += grid_step(VEC)) {
    float d[VEC], g[VEC], u[VEC], dg[VEC], du[VEC];
    load_float<VEC>(dy + i, d);
    load_float<VEC>(gate + i, g);
    load_float<VEC>(up + i, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float sg = sigmoid(g[k]);
      dg[k] = d[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
      du[k] = d[k] * g[k] * sg;
    }
    store_float<VEC>(dgate + i, dg);
    store_float<VEC>(dup + i, du);
  }
}

}  // namespace mf
