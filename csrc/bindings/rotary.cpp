// Torch binding of the fused rotary embedding kernel (csrc/kernels/rotary.cuh).
#include "common.h"

namespace {

using mf_binding::check_gpu;
using mf_binding::check_launch;
using mf_binding::current_stream;
using mf_binding::dtype_of;

// x [s, ..., d]; cos/sin hold s * d values ([s, 1, 1, d] in the model) in any float dtype; they
// are read as fp32, which is exact and what the reference computes with.
at::Tensor apply(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin,
                 bool backward) {
  const c10::DeviceGuard guard(input.device());
  check_gpu(input, input, "x");
  check_gpu(cos, input, "cos");
  check_gpu(sin, input, "sin");
  TORCH_CHECK(input.dim() >= 2, "rotary: x must be [s, ..., d], got ", input.sizes());
  const int64_t s = input.size(0);
  const int64_t d = input.size(-1);
  TORCH_CHECK(d % 2 == 0, "rotary: head dim must be even, got ", d);
  TORCH_CHECK(cos.numel() == s * d && sin.numel() == s * d, "rotary: cos/sin must hold s*d = ",
              s * d, " values, got ", cos.numel(), " and ", sin.numel());
  const at::Tensor x = input.contiguous();
  const at::Tensor c = cos.to(at::kFloat).contiguous();
  const at::Tensor sn = sin.to(at::kFloat).contiguous();
  at::Tensor y = at::empty_like(x);
  check_launch(mf::rotary(x.data_ptr(), c.data_ptr<float>(), sn.data_ptr<float>(), y.data_ptr(),
                          s, x.numel() / (s * d), d, backward, dtype_of(x, "x"),
                          current_stream()),
               backward ? "rotary backward" : "rotary forward");
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused rotate-half rotary embedding (megatron-frontier)";
  m.def("forward", [](const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
    return apply(x, c, s, false);
  });
  m.def("backward", [](const at::Tensor& g, const at::Tensor& c, const at::Tensor& s) {
    return apply(g, c, s, true);
  });
}
