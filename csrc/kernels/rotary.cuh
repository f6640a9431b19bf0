// Rotary position embedding, rotate-half convention (GPT-NeoX, Megatron, LLaMA):
//   y[:d/2] = x[:d/2] * cos[:d/2] - x[d/2:] * sin[:d/2]
//   y[d/2:] = x[d/2:] * cos[d/2:] + x[:d/2] * sin[d/2:]
// The backward is the transposed rotation of the gradient:
//   dx[:d/2] = dy[:d/2] * cos[:d/2] + dy[d/2:] * sin[d/2:]
//   dx[d/2:] = dy[d/2:] * cos[d/2:] - dy[:d/2] * sin[:d/2]
// x is [s, rows_per_s, d] (rows_per_s = batch * heads); cos/sin are fp32 [s, d]. Blocks are
// 2-D: threadIdx.x walks the d/2 pairs of a row, threadIdx.y the rows, so the sequence position
// (a 64-bit division) is computed once per row rather than once per element.
#pragma once

#include "common.cuh"

namespace mf {

template <typename T, bool BACKWARD>
__global__ void __launch_bounds__(256)
rotary_kernel(const T* __restrict__ x, const float* __restrict__ cos_t,
              const float* __restrict__ sin_t, T* __restrict__ y, int64_t s, int64_t rows_per_s,
              int64_t d) {
  const int64_t half = d / 2;
  const int64_t rows = s * rows_per_s;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t t = row / rows_per_s;
    const float* c = cos_t + t * d;
    const float* sn = sin_t + t * d;
    const T* xr = x + row * d;
    T* yr = y + row * d;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      const float x1 = to_float(xr[j]);
      const float x2 = to_float(xr[j + half]);
      float y1, y2;
      if (BACKWARD) {
        y1 = x1 * c[j] + x2 * sn[j + half];
        y2 = x2 * c[j + half] - x1 * sn[j];
      } else {
        y1 = x1 * c[j] - x2 * sn[j];
        y2 = x2 * c[j + half] + x1 * sn[j + half];
      }
      yr[j] = from_float<T>(y1);
      yr[j + half] = from_float<T>(y2);
    }
  }
}

}  // namespace mf
