// Launchers for softmax.cuh: instantiates the forward and backward kernels for fp32, fp16 and
// bf16, both mask kinds, and every per-thread register width.
#include "../softmax.cuh"

namespace mf {
namespace {

struct SoftmaxLaunch {
  int items;    // values per thread kept in registers; 0 streams the row through memory
  int threads;  // a multiple of kWarpSize
};

// The smallest register width that covers the row within its block limit (1 value a thread up
// to 256 columns, 4 up to 1024, 16 up to 8192), else streaming. Widths go up in steps of 4: each
// width is another set of kernels to compile for every target, and 2 and 8 bought little.
SoftmaxLaunch softmax_launch(int64_t sk) {
  for (int items = 1; items <= 16; items *= 4) {
    const int64_t threads = ceil_div(ceil_div(sk, items), kWarpSize) * kWarpSize;
    if (threads <= softmax_max_threads(items)) return {items, static_cast<int>(threads)};
  }
  return {0, softmax_max_threads(0)};
}

template <typename T, MaskKind K, int ITEMS>
void launch_one(bool backward, const void* a, const void* b, void* out, const uint8_t* mask,
                const SoftmaxShape& shape, float scale, int threads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(shape.rows < kMaxRowBlocks ? shape.rows : kMaxRowBlocks));
  if (backward) {
    softmax_backward_kernel<T, K, ITEMS><<<grid, threads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), mask, shape,
        scale);
  } else {
    softmax_forward_kernel<T, K, ITEMS><<<grid, threads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<T*>(out), mask, shape, scale);
  }
}

template <typename T, MaskKind K>
void launch_items(bool backward, const void* a, const void* b, void* out, const uint8_t* mask,
                  const SoftmaxShape& shape, float scale, cudaStream_t stream) {
  const SoftmaxLaunch l = softmax_launch(shape.sk);
  switch (l.items) {
    case 1: return launch_one<T, K, 1>(backward, a, b, out, mask, shape, scale, l.threads, stream);
    case 4: return launch_one<T, K, 4>(backward, a, b, out, mask, shape, scale, l.threads, stream);
    case 16: return launch_one<T, K, 16>(backward, a, b, out, mask, shape, scale, l.threads, stream);
    default: return launch_one<T, K, 0>(backward, a, b, out, mask, shape, scale, l.threads, stream);
  }
}

template <typename T>
void launch_kind(bool backward, const void* a, const void* b, void* out, const uint8_t* mask,
                 const SoftmaxShape& shape, float scale, bool causal, cudaStream_t stream) {
  if (causal) {
    launch_items<T, MaskKind::kCausal>(backward, a, b, out, nullptr, shape, scale, stream);
  } else {
    launch_items<T, MaskKind::kArbitrary>(backward, a, b, out, mask, shape, scale, stream);
  }
}

cudaError_t dispatch(bool backward, const void* a, const void* b, void* out, const uint8_t* mask,
                     const SoftmaxShape& shape, float scale, bool causal, DType dtype,
                     cudaStream_t stream) {
  if (shape.rows <= 0 || shape.sk <= 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      launch_kind<float>(backward, a, b, out, mask, shape, scale, causal, stream);
      break;
    case DType::kF16:
      launch_kind<half_t>(backward, a, b, out, mask, shape, scale, causal, stream);
      break;
    case DType::kBF16:
      launch_kind<bf16_t>(backward, a, b, out, mask, shape, scale, causal, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t softmax_forward(const void* scores, void* probs, const uint8_t* mask,
                            const SoftmaxShape& shape, float scale, bool causal, DType dtype,
                            cudaStream_t stream) {
  return dispatch(false, scores, nullptr, probs, mask, shape, scale, causal, dtype, stream);
}

cudaError_t softmax_backward(const void* grad_probs, const void* probs, void* grad_scores,
                             const uint8_t* mask, const SoftmaxShape& shape, float scale,
                             bool causal, DType dtype, cudaStream_t stream) {
  return dispatch(true, grad_probs, probs, grad_scores, mask, shape, scale, causal, dtype, stream);
}

}  // namespace mf
