// Torch binding of the scaled masked and scaled causal softmax kernels (csrc/kernels/softmax.cuh).
#include "common.h"

namespace {

using mf_binding::check_gpu;
using mf_binding::check_launch;
using mf_binding::current_stream;
using mf_binding::dtype_of;

// scores [b, np, sq, sk]; the mask broadcasts to it. The kernel reads the mask through strides,
// so a [b, 1, sq, sk] mask is never expanded in memory; only a broadcast last dimension is.
struct Mask {
  at::Tensor bytes;
  mf::SoftmaxShape shape;
};

Mask prepare(const at::Tensor& scores, const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(scores.dim() == 4, "scaled_masked_softmax: scores must be [b, np, sq, sk], got ",
              scores.sizes());
  Mask m;
  m.shape = {scores.numel() / scores.size(3), scores.size(1), scores.size(2), scores.size(3), 0, 0, 0};
  if (!mask.has_value() || !mask->defined()) return m;
  check_gpu(*mask, scores, "mask");
  TORCH_CHECK(mask->dim() <= 4, "scaled_masked_softmax: mask must have at most 4 dims, got ",
              mask->sizes());
  at::Tensor bytes = mask->scalar_type() == at::kBool ? *mask : mask->ne(0);
  bytes = bytes.expand(scores.sizes());
  if (bytes.size(3) > 1 && bytes.stride(3) != 1) bytes = bytes.contiguous();
  m.shape.mask_sb = bytes.stride(0);
  m.shape.mask_sh = bytes.stride(1);
  m.shape.mask_sq = bytes.stride(2);
  m.bytes = bytes;
  return m;
}

const uint8_t* mask_ptr(const Mask& m) {
  return m.bytes.defined() ? reinterpret_cast<const uint8_t*>(m.bytes.data_ptr<bool>()) : nullptr;
}

at::Tensor masked_forward(const at::Tensor& scores, const c10::optional<at::Tensor>& mask,
                          double scale) {
  const c10::DeviceGuard guard(scores.device());
  check_gpu(scores, scores, "scores");
  const at::Tensor x = scores.contiguous();
  const Mask m = prepare(x, mask);
  at::Tensor y = at::empty_like(x);
  check_launch(mf::softmax_forward(x.data_ptr(), y.data_ptr(), mask_ptr(m), m.shape,
                                   static_cast<float>(scale), false, dtype_of(x, "scores"),
                                   current_stream()),
               "scaled_masked_softmax forward");
  return y;
}

at::Tensor masked_backward(const at::Tensor& grad, const at::Tensor& probs,
                           const c10::optional<at::Tensor>& mask, double scale) {
  const c10::DeviceGuard guard(probs.device());
  check_gpu(grad, probs, "grad");
  const at::Tensor dy = grad.contiguous().to(probs.scalar_type());
  const at::Tensor y = probs.contiguous();
  const Mask m = prepare(y, mask);
  at::Tensor dx = at::empty_like(y);
  check_launch(mf::softmax_backward(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), mask_ptr(m),
                                    m.shape, static_cast<float>(scale), false,
                                    dtype_of(y, "probs"), current_stream()),
               "scaled_masked_softmax backward");
  return dx;
}

// Causal scores are [b * np, sq, sk]; column k > row q is masked.
mf::SoftmaxShape causal_shape(const at::Tensor& scores) {
  TORCH_CHECK(scores.dim() == 3, "scaled_causal_softmax: scores must be [b*np, sq, sk], got ",
              scores.sizes());
  return {scores.numel() / scores.size(2), 1, scores.size(1), scores.size(2), 0, 0, 0};
}

at::Tensor causal_forward(const at::Tensor& scores, double scale) {
  const c10::DeviceGuard guard(scores.device());
  check_gpu(scores, scores, "scores");
  const at::Tensor x = scores.contiguous();
  at::Tensor y = at::empty_like(x);
  check_launch(mf::softmax_forward(x.data_ptr(), y.data_ptr(), nullptr, causal_shape(x),
                                   static_cast<float>(scale), true, dtype_of(x, "scores"),
                                   current_stream()),
               "scaled_causal_softmax forward");
  return y;
}

at::Tensor causal_backward(const at::Tensor& grad, const at::Tensor& probs, double scale) {
  const c10::DeviceGuard guard(probs.device());
  check_gpu(grad, probs, "grad");
  const at::Tensor dy = grad.contiguous().to(probs.scalar_type());
  const at::Tensor y = probs.contiguous();
  at::Tensor dx = at::empty_like(y);
  check_launch(mf::softmax_backward(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), nullptr,
                                    causal_shape(y), static_cast<float>(scale), true,
                                    dtype_of(y, "probs"), current_stream()),
               "scaled_causal_softmax backward");
  return dx;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused scaled masked / causal softmax (megatron-frontier)";
  m.def("masked_forward", &masked_forward, "probs = softmax(mask(scores * scale))");
  m.def("masked_backward", &masked_backward, "grad of scores from grad of probs");
  m.def("causal_forward", &causal_forward, "probs = softmax(causal(scores * scale))");
  m.def("causal_backward", &causal_backward, "grad of scores from grad of probs");
}
