// Torch binding of the fused LayerNorm and RMSNorm kernels (csrc/kernels/norm.cuh).
#include <vector>

#include "common.h"

namespace {

using mf_binding::check_gpu;
using mf_binding::check_launch;
using mf_binding::current_stream;
using mf_binding::dtype_of;

// The kernels take weights in the input dtype or in fp32. Any other pairing (fp32 input with
// 16-bit weights, or a bias whose dtype differs from the weight's) is widened to fp32, which is
// exact and matches the reference, which computes with weight.float().
at::Tensor kernel_weight(const at::Tensor& w, const at::Tensor& x, bool widen) {
  if (!w.defined()) return w;
  const bool native = w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kFloat;
  return (native && !widen ? w : w.to(at::kFloat)).contiguous();
}

bool must_widen(const at::Tensor& w, const at::Tensor& b) {
  return b.defined() && b.scalar_type() != w.scalar_type() && w.scalar_type() != at::kFloat;
}

std::vector<at::Tensor> forward(const at::Tensor& input, const at::Tensor& weight,
                                const c10::optional<at::Tensor>& bias, double eps, bool rms) {
  const c10::DeviceGuard guard(input.device());
  check_gpu(input, input, "input");
  check_gpu(weight, input, "weight");
  const int64_t n = weight.numel();
  TORCH_CHECK(n > 0 && input.size(-1) == n, "norm: input's last dim ", input.size(-1),
              " differs from weight size ", n);
  const at::Tensor x = input.contiguous();
  const at::Tensor b_in = bias.has_value() ? *bias : at::Tensor();
  const bool widen = must_widen(weight, b_in);
  const at::Tensor w = kernel_weight(weight, x, widen);
  at::Tensor b = b_in.defined() ? b_in.to(w.scalar_type()).contiguous() : b_in;
  const int64_t rows = x.numel() / n;
  at::Tensor y = at::empty_like(x);
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({rms ? 0 : rows}, f32);
  at::Tensor rstd = at::empty({rows}, f32);
  check_launch(mf::norm_forward(x.data_ptr(), w.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                                y.data_ptr(), rms ? nullptr : mean.data_ptr<float>(),
                                rstd.data_ptr<float>(), rows, n, static_cast<float>(eps), rms,
                                dtype_of(x, "input"), dtype_of(w, "weight"), current_stream()),
               rms ? "rms_norm forward" : "layer_norm forward");
  return {y, mean, rstd};
}

// Returns grad_input, grad_weight (fp32) and grad_bias (fp32; empty for RMSNorm or no bias).
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& input,
                                 const at::Tensor& weight, const at::Tensor& mean,
                                 const at::Tensor& rstd, bool rms, bool has_bias) {
  const c10::DeviceGuard guard(input.device());
  check_gpu(grad, input, "grad");
  const at::Tensor x = input.contiguous();
  const at::Tensor dy = grad.contiguous().to(x.scalar_type());
  // The backward never needs the forward's widening: its math is fp32 whichever way the weight
  // is stored, so the native pairing gives the same result.
  const at::Tensor w = kernel_weight(weight, x, false);
  const int64_t n = w.numel();
  const int64_t rows = x.numel() / n;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t chunks = mf::norm_weight_grad_chunks(rows, n, sms);
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor dx = at::empty_like(x);
  at::Tensor g_part = at::empty({chunks, n}, f32);
  at::Tensor b_part = (!rms && has_bias) ? at::empty({chunks, n}, f32) : at::Tensor();
  check_launch(mf::norm_backward(dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                 rms ? nullptr : mean.data_ptr<float>(), rstd.data_ptr<float>(),
                                 dx.data_ptr(), g_part.data_ptr<float>(),
                                 b_part.defined() ? b_part.data_ptr<float>() : nullptr, chunks,
                                 rows, n, rms, dtype_of(x, "input"), dtype_of(w, "weight"),
                                 current_stream()),
               rms ? "rms_norm backward" : "layer_norm backward");
  return {dx, g_part.sum(0), b_part.defined() ? b_part.sum(0) : at::Tensor()};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused LayerNorm / RMSNorm with fp32 statistics (megatron-frontier)";
  m.def("forward", &forward, "y, mean, rstd = norm(input, weight, bias, eps, rms)");
  m.def("backward", &backward, "grad_input, grad_weight, grad_bias (fp32 weight grads)");
}
