// Launchers for norm.cuh: LayerNorm and RMSNorm, forward and backward, for the input/weight dtype
// pairs fp32/fp32, fp16/fp16, bf16/bf16, fp16/fp32 and bf16/fp32; scalar, 4-wide and, for 16-bit
// inputs, 8-wide accesses (16 bytes: the widest single load, measured on an H200 at 39-47% of
// HBM bandwidth with 8-byte ones).
#include <initializer_list>
#include <utility>

#include "../norm.cuh"

namespace mf {
namespace {

constexpr int kVec = 4;
// 16 bytes of a 16-bit input per access; fp32 inputs stay at four (16 bytes already).
template <typename T>
constexpr int wide_vec() { return sizeof(T) == 2 ? 8 : kVec; }

int norm_threads(int64_t n, int vec) {
  const int64_t want = ceil_div(ceil_div(n, vec), kWarpSize) * kWarpSize;
  return static_cast<int>(want < 512 ? want : 512);
}

// vec-wide accesses need the row length divisible by vec and every base pointer aligned to a
// pack; torch allocations are, views at odd offsets may not be.
bool can_vectorize(int64_t n, int vec, std::initializer_list<std::pair<const void*, int>> ptrs) {
  if (n % vec != 0) return false;
  for (const auto& p : ptrs) {
    if (!aligned(p.first, static_cast<int64_t>(p.second) * vec)) return false;
  }
  return true;
}

struct NormArgs {
  const void* x;
  const void* gamma;
  const void* beta;
  const void* dy;
  void* out;
  float* mean;
  float* rstd;
  float* gamma_partial;
  float* beta_partial;
  int64_t chunks;
  int64_t rows;
  int64_t n;
  float eps;
  bool rms;
  bool backward;
};

template <typename T, typename W, bool RMS, int VEC>
void launch_rows(const NormArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.rows < kMaxRowBlocks ? a.rows : kMaxRowBlocks));
  const int threads = norm_threads(a.n, VEC);
  const T* x = static_cast<const T*>(a.x);
  const W* gamma = static_cast<const W*>(a.gamma);
  if (!a.backward) {
    norm_forward_kernel<T, W, RMS, VEC><<<grid, threads, 0, stream>>>(
        x, gamma, static_cast<const W*>(a.beta), static_cast<T*>(a.out), a.mean, a.rstd, a.rows,
        a.n, a.eps);
    return;
  }
  norm_backward_input_kernel<T, W, RMS, VEC><<<grid, threads, 0, stream>>>(
      static_cast<const T*>(a.dy), x, gamma, a.mean, a.rstd, static_cast<T*>(a.out), a.rows, a.n);
  const dim3 wgrid(static_cast<unsigned>(ceil_div(a.n, kGradCols)),
                   static_cast<unsigned>(a.chunks));
  norm_backward_weight_kernel<T, RMS><<<wgrid, dim3(kGradCols, kGradRows), 0, stream>>>(
      static_cast<const T*>(a.dy), x, a.mean, a.rstd, a.gamma_partial, a.beta_partial, a.rows,
      a.n, ceil_div(a.rows, a.chunks));
}

template <typename T, typename W, bool RMS>
void launch_widest(const NormArgs& a, cudaStream_t stream) {
  const auto fits = [&](int vec) {
    return can_vectorize(a.n, vec, {{a.x, sizeof(T)}, {a.dy, sizeof(T)}, {a.out, sizeof(T)},
                                    {a.gamma, sizeof(W)}, {a.beta, sizeof(W)}});
  };
  constexpr int kWide = wide_vec<T>();
  if (kWide != kVec && fits(kWide)) {
    launch_rows<T, W, RMS, kWide>(a, stream);
  } else if (fits(kVec)) {
    launch_rows<T, W, RMS, kVec>(a, stream);
  } else {
    launch_rows<T, W, RMS, 1>(a, stream);
  }
}

template <typename T, typename W>
void launch_typed(const NormArgs& a, cudaStream_t stream) {
  a.rms ? launch_widest<T, W, true>(a, stream) : launch_widest<T, W, false>(a, stream);
}

cudaError_t dispatch(const NormArgs& a, DType x_dtype, DType w_dtype, cudaStream_t stream) {
  if (a.rows <= 0 || a.n <= 0) return cudaSuccess;
  if (x_dtype == DType::kF32 && w_dtype == DType::kF32) {
    launch_typed<float, float>(a, stream);
  } else if (x_dtype == DType::kF16 && w_dtype == DType::kF16) {
    launch_typed<half_t, half_t>(a, stream);
  } else if (x_dtype == DType::kBF16 && w_dtype == DType::kBF16) {
    launch_typed<bf16_t, bf16_t>(a, stream);
  } else if (x_dtype == DType::kF16 && w_dtype == DType::kF32) {
    launch_typed<half_t, float>(a, stream);
  } else if (x_dtype == DType::kBF16 && w_dtype == DType::kF32) {
    launch_typed<bf16_t, float>(a, stream);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t norm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean,
                         float* rstd, int64_t rows, int64_t n, float eps, bool rms, DType x_dtype,
                         DType w_dtype, cudaStream_t stream) {
  const NormArgs a{x, gamma, beta, nullptr, y, mean, rstd, nullptr, nullptr, 0, rows, n, eps,
                   rms, false};
  return dispatch(a, x_dtype, w_dtype, stream);
}

int64_t norm_weight_grad_chunks(int64_t rows, int64_t n, int sm_count) {
  // Enough blocks for about four per multiprocessor, never a chunk thinner than the row lanes.
  const int64_t col_blocks = ceil_div(n, kGradCols);
  const int64_t wanted = ceil_div(4 * static_cast<int64_t>(sm_count > 0 ? sm_count : 1), col_blocks);
  const int64_t most = ceil_div(rows, kGradRows);
  const int64_t chunks = wanted < most ? wanted : most;
  return chunks > 0 ? (chunks < 65535 ? chunks : 65535) : 1;
}

cudaError_t norm_backward(const void* grad_y, const void* x, const void* gamma, const float* mean,
                          const float* rstd, void* grad_x, float* gamma_partial,
                          float* beta_partial, int64_t chunks, int64_t rows, int64_t n, bool rms,
                          DType x_dtype, DType w_dtype, cudaStream_t stream) {
  if (chunks <= 0 || chunks > 65535) return cudaErrorInvalidValue;
  const NormArgs a{x, gamma, nullptr, grad_y, grad_x, const_cast<float*>(mean),
                   const_cast<float*>(rstd), gamma_partial, beta_partial, chunks, rows, n, 0.0f,
                   rms, true};
  return dispatch(a, x_dtype, w_dtype, stream);
}

}  // namespace mf
