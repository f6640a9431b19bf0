// Launchers for activation.cuh: bias+GeLU and SwiGLU, forward and backward, for fp32, fp16 and
// bf16, scalar, 4-wide and (16-bit types) 8-wide accesses: 16 bytes a load, as torch's own
// elementwise kernels do; 8-byte loads left the 16-bit kernels at 38-45% of the H200's
// bandwidth (benchmarks/results/kernels_nvidia_h200.md).
#include "../activation.cuh"

namespace mf {
namespace {

constexpr int kVec = 4;
constexpr int kThreads = 256;
template <typename T>
constexpr int wide_vec() { return sizeof(T) == 2 ? 8 : kVec; }

dim3 elementwise_grid(int64_t numel, int vec) {
  const int64_t blocks = ceil_div(ceil_div(numel, vec), kThreads);
  return dim3(static_cast<unsigned>(blocks < kMaxRowBlocks ? blocks : kMaxRowBlocks));
}

// vec-wide packs need numel and the row length divisible by vec (a pack never straddles two
// rows of the bias) and every pointer aligned to the pack.
template <typename T>
bool vectorizable(int vec, int64_t numel, int64_t n, const void* a, const void* b,
                  const void* c, const void* d, const void* e) {
  const int64_t bytes = static_cast<int64_t>(sizeof(T)) * vec;
  return numel % vec == 0 && n % vec == 0 && aligned(a, bytes) && aligned(b, bytes) &&
         aligned(c, bytes) && aligned(d, bytes) && aligned(e, bytes);
}

enum class Op { kGeluForward, kGeluBackward, kSwigluForward, kSwigluBackward };

// in0/in1/in2 and out0/out1 are the kernel's tensors in argument order.
struct ActArgs {
  const void* in0;
  const void* in1;
  const void* in2;
  const float* bias;
  void* out0;
  void* out1;
  int64_t numel;
  int64_t n;
};

template <typename T, int VEC>
void launch_vec(Op op, const ActArgs& a, cudaStream_t stream) {
  const dim3 grid = elementwise_grid(a.numel, VEC);
  const T* i0 = static_cast<const T*>(a.in0);
  const T* i1 = static_cast<const T*>(a.in1);
  const T* i2 = static_cast<const T*>(a.in2);
  T* o0 = static_cast<T*>(a.out0);
  switch (op) {
    case Op::kGeluForward:
      bias_gelu_forward_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(i0, a.bias, o0, a.numel, a.n);
      break;
    case Op::kGeluBackward:
      bias_gelu_backward_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(i0, i1, a.bias, o0,
                                                                       a.numel, a.n);
      break;
    case Op::kSwigluForward:
      swiglu_forward_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(i0, i1, o0, a.numel);
      break;
    case Op::kSwigluBackward:
      swiglu_backward_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(
          i0, i1, i2, o0, static_cast<T*>(a.out1), a.numel);
      break;
  }
}

template <typename T>
void launch_typed(Op op, const ActArgs& a, cudaStream_t stream) {
  constexpr int kWide = wide_vec<T>();
  const auto fits = [&](int vec) {
    return vectorizable<T>(vec, a.numel, a.n, a.in0, a.in1, a.in2, a.out0, a.out1);
  };
  if (kWide != kVec && fits(kWide)) {
    launch_vec<T, kWide>(op, a, stream);
  } else if (fits(kVec)) {
    launch_vec<T, kVec>(op, a, stream);
  } else {
    launch_vec<T, 1>(op, a, stream);
  }
}

cudaError_t dispatch(Op op, const ActArgs& a, DType dtype, cudaStream_t stream) {
  if (a.numel <= 0) return cudaSuccess;
  if (a.n <= 0) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kF32:
      launch_typed<float>(op, a, stream);
      break;
    case DType::kF16:
      launch_typed<half_t>(op, a, stream);
      break;
    case DType::kBF16:
      launch_typed<bf16_t>(op, a, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t bias_gelu_forward(const void* x, const float* bias, void* y, int64_t numel,
                              int64_t n, DType dtype, cudaStream_t stream) {
  return dispatch(Op::kGeluForward, {x, nullptr, nullptr, bias, y, nullptr, numel, n}, dtype,
                  stream);
}

cudaError_t bias_gelu_backward(const void* grad_y, const void* x, const float* bias,
                               void* grad_x, int64_t numel, int64_t n, DType dtype,
                               cudaStream_t stream) {
  return dispatch(Op::kGeluBackward, {grad_y, x, nullptr, bias, grad_x, nullptr, numel, n},
                  dtype, stream);
}

cudaError_t swiglu_forward(const void* gate, const void* up, void* y, int64_t numel, DType dtype,
                           cudaStream_t stream) {
  return dispatch(Op::kSwigluForward, {gate, up, nullptr, nullptr, y, nullptr, numel, 1}, dtype,
                  stream);
}

cudaError_t swiglu_backward(const void* grad_y, const void* gate, const void* up,
                            void* grad_gate, void* grad_up, int64_t numel, DType dtype,
                            cudaStream_t stream) {
  return dispatch(Op::kSwigluBackward, {grad_y, gate, up, nullptr, grad_gate, grad_up, numel, 1},
                  dtype, stream);
}

}  // namespace mf
