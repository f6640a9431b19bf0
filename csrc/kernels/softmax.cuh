// Scaled masked softmax over the last dimension of attention scores, forward and backward.
//
// One block per row. ITEMS > 0 keeps the row in registers (ITEMS values per thread, strided by
// blockDim so that loads coalesce) and reads it from memory once; ITEMS == 0 streams rows longer
// than 512 * 16 through memory twice with an online max/sum, so any length works.
//
// Masking follows the references in megatron/kernels/reference.py exactly:
//  - arbitrary mask: a masked score becomes -10000 after scaling (a fully masked row therefore
//    comes out uniform, as in Megatron), and its gradient is zero;
//  - causal: column k > row q is -inf, i.e. probability 0 and gradient 0.
#pragma once

#include <math.h>

#include "common.cuh"

namespace mf {

enum class MaskKind : int { kArbitrary = 0, kCausal = 1 };

// The largest block each register width is launched with. The bound is also the kernel's
// __launch_bounds__, which sets how many registers a thread may use: 16 values a thread (two
// arrays of them in the backward) spill at 1024 threads, not at 512.
__host__ __device__ constexpr int softmax_max_threads(int items) {
  return items == 0 ? 1024 : items >= 16 ? 512 : 256;
}

constexpr float kMaskedScore = -10000.0f;

// Columns are int: a row of 2^31 scores is far beyond any attention length, and 32-bit column
// indices keep the 16-value register path free of spills (64-bit indices per value spilled).
struct SoftmaxRow {
  int64_t offset;       // of the row in scores/probs
  const uint8_t* mask;  // row of the arbitrary mask, or nullptr
  int limit;            // columns >= limit are causally masked (sk for an arbitrary mask)
};

template <MaskKind K>
__device__ __forceinline__ SoftmaxRow softmax_row(int64_t row, const uint8_t* mask,
                                                  const SoftmaxShape& s) {
  const int64_t q = row % s.sq;
  SoftmaxRow r{row * s.sk, nullptr, static_cast<int>(s.sk)};
  if (K == MaskKind::kCausal) {
    r.limit = static_cast<int>(q + 1 < s.sk ? q + 1 : s.sk);
  } else if (mask != nullptr) {
    const int64_t bh = row / s.sq;
    r.mask = mask + (bh / s.heads) * s.mask_sb + (bh % s.heads) * s.mask_sh + q * s.mask_sq;
  }
  return r;
}

// The scaled score of column j of row xr, with the arbitrary mask applied; callers handle
// j >= limit.
template <typename T>
__device__ __forceinline__ float scaled_score(const T* xr, const SoftmaxRow& r, int j,
                                              float scale) {
  if (r.mask != nullptr && r.mask[j]) return kMaskedScore;
  return to_float(xr[j]) * scale;
}

template <typename T, MaskKind K, int ITEMS>
__global__ void __launch_bounds__(softmax_max_threads(ITEMS))
softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, const uint8_t* __restrict__ mask,
                       SoftmaxShape shape, float scale) {
  __shared__ float staging[kMaxWarps];
  for (int64_t row = blockIdx.x; row < shape.rows; row += gridDim.x) {
    const SoftmaxRow r = softmax_row<K>(row, mask, shape);
    const T* xr = x + r.offset;
    T* yr = y + r.offset;
    const int sk = static_cast<int>(shape.sk);
    if (ITEMS > 0) {
      constexpr int kItems = ITEMS > 0 ? ITEMS : 1;
      float v[kItems];
      float row_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        v[i] = j < r.limit ? scaled_score(xr, r, j, scale) : -INFINITY;
        row_max = fmaxf(row_max, v[i]);
      }
      row_max = block_reduce(row_max, MaxOp(), -INFINITY, staging);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        v[i] = j < r.limit ? expf(v[i] - row_max) : 0.0f;
        sum += v[i];
      }
      const float inv = 1.0f / block_reduce(sum, SumOp(), 0.0f, staging);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        if (j < sk) yr[j] = from_float<T>(v[i] * inv);
      }
    } else {
      // Online softmax: a running max m and a sum s of exp(v - m), rescaled when m grows.
      float m = -INFINITY, s = 0.0f;
      for (int j = threadIdx.x; j < r.limit; j += blockDim.x) {
        const float v = scaled_score(xr, r, j, scale);
        if (v > m) {
          s = s * expf(m - v) + 1.0f;
          m = v;
        } else {
          s += expf(v - m);
        }
      }
      const float row_max = block_reduce(m, MaxOp(), -INFINITY, staging);
      s = m == -INFINITY ? 0.0f : s * expf(m - row_max);
      const float inv = 1.0f / block_reduce(s, SumOp(), 0.0f, staging);
      for (int j = threadIdx.x; j < sk; j += blockDim.x) {
        const float p = j < r.limit ? expf(scaled_score(xr, r, j, scale) - row_max) * inv : 0.0f;
        yr[j] = from_float<T>(p);
      }
    }
  }
}

// grad_x = scale * y * (grad_y - sum_k grad_y[k] * y[k]); zero where the score was masked.
template <typename T, MaskKind K, int ITEMS>
__global__ void __launch_bounds__(softmax_max_threads(ITEMS))
softmax_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                        const uint8_t* __restrict__ mask, SoftmaxShape shape, float scale) {
  __shared__ float staging[kMaxWarps];
  for (int64_t row = blockIdx.x; row < shape.rows; row += gridDim.x) {
    const SoftmaxRow r = softmax_row<K>(row, mask, shape);
    const T* dyr = dy + r.offset;
    const T* yr = y + r.offset;
    T* dxr = dx + r.offset;
    const int sk = static_cast<int>(shape.sk);
    if (ITEMS > 0) {
      constexpr int kItems = ITEMS > 0 ? ITEMS : 1;
      float g[kItems], p[kItems];
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        const bool live = j < r.limit;
        g[i] = live ? to_float(dyr[j]) : 0.0f;
        p[i] = live ? to_float(yr[j]) : 0.0f;
        dot += g[i] * p[i];
      }
      dot = block_reduce(dot, SumOp(), 0.0f, staging);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        if (j >= sk) continue;
        const bool masked = j >= r.limit || (r.mask != nullptr && r.mask[j]);
        dxr[j] = from_float<T>(masked ? 0.0f : scale * p[i] * (g[i] - dot));
      }
    } else {
      float dot = 0.0f;
      for (int j = threadIdx.x; j < r.limit; j += blockDim.x) {
        dot += to_float(dyr[j]) * to_float(yr[j]);
      }
      dot = block_reduce(dot, SumOp(), 0.0f, staging);
      for (int j = threadIdx.x; j < sk; j += blockDim.x) {
        const bool masked = j >= r.limit || (r.mask != nullptr && r.mask[j]);
        const float g = masked ? 0.0f : scale * to_float(yr[j]) * (to_float(dyr[j]) - dot);
        dxr[j] = from_float<T>(g);
      }
    }
  }
}

}  // namespace mf
