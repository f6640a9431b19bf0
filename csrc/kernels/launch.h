// Host entry points of the fused kernels: plain pointers, sizes and a stream, no torch types.
// The torch bindings (csrc/bindings/*.cpp) call these; csrc/kernels/instantiate/*.cu define them
// and, in doing so, instantiate every kernel template for every supported dtype, which is what
// lets the device code be compiled and checked for each architecture without torch.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace mf {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// scores: rows = batch * heads * sq rows of sk contiguous values (row = (b * heads + h) * sq + q).
// mask: bytes, nonzero = masked out; element (b, h, q, k) at b*mask_sb + h*mask_sh + q*mask_sq + k
// (a stride of 0 broadcasts that dimension). Causal masking needs no mask pointer.
struct SoftmaxShape {
  int64_t rows;
  int64_t heads;
  int64_t sq;
  int64_t sk;
  int64_t mask_sb;
  int64_t mask_sh;
  int64_t mask_sq;
};

cudaError_t softmax_forward(const void* scores, void* probs, const uint8_t* mask,
                            const SoftmaxShape& shape, float scale, bool causal, DType dtype,
                            cudaStream_t stream);
cudaError_t softmax_backward(const void* grad_probs, const void* probs, void* grad_scores,
                             const uint8_t* mask, const SoftmaxShape& shape, float scale,
                             bool causal, DType dtype, cudaStream_t stream);

// LayerNorm (rms = false) and RMSNorm (rms = true) over the last dimension n of rows x n.
// Input and weight dtypes may differ (e.g. bf16 activations with fp32 weights); statistics and
// math are fp32; mean (LayerNorm only) and rstd are saved as fp32 [rows] for the backward.
cudaError_t norm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean,
                         float* rstd, int64_t rows, int64_t n, float eps, bool rms, DType x_dtype,
                         DType w_dtype, cudaStream_t stream);
// How many row chunks the weight-gradient reduction uses: the caller allocates
// chunks x n fp32 partial sums (one buffer for gamma, one for beta) and sums them over chunks.
int64_t norm_weight_grad_chunks(int64_t rows, int64_t n, int sm_count);
cudaError_t norm_backward(const void* grad_y, const void* x, const void* gamma, const float* mean,
                          const float* rstd, void* grad_x, float* gamma_partial,
                          float* beta_partial, int64_t chunks, int64_t rows, int64_t n, bool rms,
                          DType x_dtype, DType w_dtype, cudaStream_t stream);

// Rotate-half rotary embedding of x [s, rows_per_s, d] with cos/sin fp32 [s, d]; backward applies
// the transposed rotation to the gradient.
cudaError_t rotary(const void* x, const float* cos, const float* sin, void* y, int64_t s,
                   int64_t rows_per_s, int64_t d, bool backward, DType dtype, cudaStream_t stream);

// y = gelu_tanh(x + bias) with x [numel / n, n] and an optional fp32 bias [n].
cudaError_t bias_gelu_forward(const void* x, const float* bias, void* y, int64_t numel,
                              int64_t n, DType dtype, cudaStream_t stream);
cudaError_t bias_gelu_backward(const void* grad_y, const void* x, const float* bias,
                               void* grad_x, int64_t numel, int64_t n, DType dtype,
                               cudaStream_t stream);

// y = silu(gate) * up, elementwise.
cudaError_t swiglu_forward(const void* gate, const void* up, void* y, int64_t numel, DType dtype,
                           cudaStream_t stream);
cudaError_t swiglu_backward(const void* grad_y, const void* gate, const void* up,
                            void* grad_gate, void* grad_up, int64_t numel, DType dtype,
                            cudaStream_t stream);

}  // namespace mf
