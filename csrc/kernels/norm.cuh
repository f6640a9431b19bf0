// Fused LayerNorm and RMSNorm over the last dimension, forward and backward.
//
// Input T and weight W may differ (bf16 activations with fp32 master-precision weights is the
// common mixed case); every statistic is fp32. The forward is one block per row and reads the row
// three times (mean, then the sum of squared deviations, then the output): the repeated reads hit
// L1/L2, and the two-pass variance avoids the cancellation of E[x^2] - E[x]^2 on rows with a
// large mean. VEC = 4 moves four elements per access when the row length and pointers allow.
#pragma once

#include <math.h>

#include "common.cuh"

namespace mf {

template <typename T, typename W, bool RMS, int VEC>
__global__ void __launch_bounds__(kMaxBlock)
norm_forward_kernel(const T* __restrict__ x, const W* __restrict__ gamma,
                    const W* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
                    float* __restrict__ rstd_out, int64_t rows, int64_t n, float eps) {
  __shared__ float staging[kMaxWarps];
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    float mean = 0.0f;
    if (!RMS) {
      float sum = 0.0f;
      for (int64_t j = threadIdx.x * VEC; j < n; j += step) {
        float v[VEC];
        load_float<VEC>(xr + j, v);
#pragma unroll
        for (int i = 0; i < VEC; ++i) sum += v[i];
      }
      mean = block_reduce(sum, SumOp(), 0.0f, staging) / static_cast<float>(n);
    }
    float sq = 0.0f;
    for (int64_t j = threadIdx.x * VEC; j < n; j += step) {
      float v[VEC];
      load_float<VEC>(xr + j, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) sq += (v[i] - mean) * (v[i] - mean);
    }
    const float var = block_reduce(sq, SumOp(), 0.0f, staging) / static_cast<float>(n);
    const float rstd = rsqrtf(var + eps);
    if (threadIdx.x == 0) {
      if (!RMS) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    for (int64_t j = threadIdx.x * VEC; j < n; j += step) {
      float v[VEC], g[VEC], b[VEC] = {};
      load_float<VEC>(xr + j, v);
      load_float<VEC>(gamma + j, g);
      if (!RMS && beta != nullptr) load_float<VEC>(beta + j, b);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = (v[i] - mean) * rstd * g[i] + b[i];
      store_float<VEC>(y + row * n + j, v);
    }
  }
}

// grad_x = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)); RMSNorm drops the mean(g*dy)
// term because it has no centring.
template <typename T, typename W, bool RMS, int VEC>
__global__ void __launch_bounds__(kMaxBlock)
norm_backward_input_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                           const W* __restrict__ gamma, const float* __restrict__ mean_in,
                           const float* __restrict__ rstd_in, T* __restrict__ dx, int64_t rows,
                           int64_t n) {
  __shared__ float staging[kMaxWarps];
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * n;
    const float mean = RMS ? 0.0f : mean_in[row];
    const float rstd = rstd_in[row];
    float sum_gdy = 0.0f, sum_gdy_xhat = 0.0f;
    for (int64_t j = threadIdx.x * VEC; j < n; j += step) {
      float d[VEC], v[VEC], g[VEC];
      load_float<VEC>(dy + base + j, d);
      load_float<VEC>(x + base + j, v);
      load_float<VEC>(gamma + j, g);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        sum_gdy += g[i] * d[i];
        sum_gdy_xhat += g[i] * d[i] * (v[i] - mean) * rstd;
      }
    }
    const float inv_n = 1.0f / static_cast<float>(n);
    const float a = RMS ? 0.0f : block_reduce(sum_gdy, SumOp(), 0.0f, staging) * inv_n;
    const float b = block_reduce(sum_gdy_xhat, SumOp(), 0.0f, staging) * inv_n;
    for (int64_t j = threadIdx.x * VEC; j < n; j += step) {
      float d[VEC], v[VEC], g[VEC];
      load_float<VEC>(dy + base + j, d);
      load_float<VEC>(x + base + j, v);
      load_float<VEC>(gamma + j, g);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = rstd * (g[i] * d[i] - a - (v[i] - mean) * rstd * b);
      store_float<VEC>(dx + base + j, v);
    }
  }
}

// Column sums over a chunk of rows: gamma_partial[chunk, j] = sum_r dy[r, j] * xhat[r, j] and
// beta_partial[chunk, j] = sum_r dy[r, j]. A block covers kGradCols columns (coalesced across
// threadIdx.x) and kGradRows row lanes, reduced through shared memory; the caller sums chunks.
constexpr int kGradCols = 32;
constexpr int kGradRows = 8;

template <typename T, bool RMS>
__global__ void __launch_bounds__(kGradCols * kGradRows)
norm_backward_weight_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                            const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                            float* __restrict__ gamma_partial, float* __restrict__ beta_partial,
                            int64_t rows, int64_t n, int64_t rows_per_chunk) {
  __shared__ float g_acc[kGradRows][kGradCols + 1];  // +1 avoids bank conflicts on the transpose
  __shared__ float b_acc[kGradRows][kGradCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kGradCols + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float g = 0.0f, b = 0.0f;
  if (col < n) {
    for (int64_t r = first + threadIdx.y; r < last; r += kGradRows) {
      const float d = to_float(dy[r * n + col]);
      const float mean = RMS ? 0.0f : mean_in[r];
      g += d * (to_float(x[r * n + col]) - mean) * rstd_in[r];
      b += d;
    }
  }
  g_acc[threadIdx.y][threadIdx.x] = g;
  b_acc[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    for (int i = 1; i < kGradRows; ++i) {
      g += g_acc[i][threadIdx.x];
      b += b_acc[i][threadIdx.x];
    }
    gamma_partial[blockIdx.y * n + col] = g;
    if (!RMS && beta_partial != nullptr) beta_partial[blockIdx.y * n + col] = b;
  }
}

}  // namespace mf
