// Launchers for rotary.cuh: forward and backward for fp32, fp16 and bf16.
#include "../rotary.cuh"

namespace mf {
namespace {

template <typename T>
void launch(const void* x, const float* cos, const float* sin, void* y, int64_t s,
            int64_t rows_per_s, int64_t d, bool backward, cudaStream_t stream) {
  // threadIdx.x covers the pairs of a row, threadIdx.y packs several rows into 256 threads; the
  // kernel uses no lane shuffles, so the block need not be whole warps or wavefronts.
  const int64_t pair_threads = ceil_div(d / 2, 32) * 32;
  const dim3 block(static_cast<unsigned>(pair_threads < 256 ? pair_threads : 256),
                   static_cast<unsigned>(pair_threads < 256 ? 256 / pair_threads : 1));
  const int64_t blocks = ceil_div(s * rows_per_s, block.y);
  const dim3 grid(static_cast<unsigned>(blocks < kMaxRowBlocks ? blocks : kMaxRowBlocks));
  const T* in = static_cast<const T*>(x);
  T* out = static_cast<T*>(y);
  if (backward) {
    rotary_kernel<T, true><<<grid, block, 0, stream>>>(in, cos, sin, out, s, rows_per_s, d);
  } else {
    rotary_kernel<T, false><<<grid, block, 0, stream>>>(in, cos, sin, out, s, rows_per_s, d);
  }
}

}  // namespace

cudaError_t rotary(const void* x, const float* cos, const float* sin, void* y, int64_t s,
                   int64_t rows_per_s, int64_t d, bool backward, DType dtype,
                   cudaStream_t stream) {
  if (d % 2 != 0) return cudaErrorInvalidValue;
  if (s <= 0 || rows_per_s <= 0 || d <= 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      launch<float>(x, cos, sin, y, s, rows_per_s, d, backward, stream);
      break;
    case DType::kF16:
      launch<half_t>(x, cos, sin, y, s, rows_per_s, d, backward, stream);
      break;
    case DType::kBF16:
      launch<bf16_t>(x, cos, sin, y, s, rows_per_s, d, backward, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace mf
