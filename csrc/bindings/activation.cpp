// Torch binding of the fused bias+GeLU and SwiGLU kernels (csrc/kernels/activation.cuh).
#include <vector>

#include "common.h"

namespace {

using mf_binding::check_gpu;
using mf_binding::check_launch;
using mf_binding::current_stream;
using mf_binding::dtype_of;
using mf_binding::float_ptr_or_null;

// The bias is read as fp32 (exact for any float dtype, as in the reference's bias.float()).
at::Tensor float_bias(const c10::optional<at::Tensor>& bias, const at::Tensor& x) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  check_gpu(*bias, x, "bias");
  TORCH_CHECK(bias->numel() == x.size(-1), "bias_gelu: bias has ", bias->numel(),
              " values, expected the last dim of x, ", x.size(-1));
  return bias->to(at::kFloat).contiguous();
}

at::Tensor gelu_forward(const at::Tensor& input, const c10::optional<at::Tensor>& bias) {
  const c10::DeviceGuard guard(input.device());
  check_gpu(input, input, "x");
  const at::Tensor x = input.contiguous();
  const at::Tensor b = float_bias(bias, x);
  at::Tensor y = at::empty_like(x);
  check_launch(mf::bias_gelu_forward(x.data_ptr(), float_ptr_or_null(b), y.data_ptr(), x.numel(),
                                     x.size(-1), dtype_of(x, "x"), current_stream()),
               "bias_gelu forward");
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& input,
                         const c10::optional<at::Tensor>& bias) {
  const c10::DeviceGuard guard(input.device());
  check_gpu(grad, input, "grad");
  const at::Tensor x = input.contiguous();
  const at::Tensor dy = grad.contiguous().to(x.scalar_type());
  const at::Tensor b = float_bias(bias, x);
  at::Tensor dx = at::empty_like(x);
  check_launch(mf::bias_gelu_backward(dy.data_ptr(), x.data_ptr(), float_ptr_or_null(b),
                                      dx.data_ptr(), x.numel(), x.size(-1), dtype_of(x, "x"),
                                      current_stream()),
               "bias_gelu backward");
  return dx;
}

void check_pair(const at::Tensor& gate, const at::Tensor& up) {
  check_gpu(gate, gate, "gate");
  check_gpu(up, gate, "up");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "swiglu: gate and up must match in shape and dtype, got ", gate.sizes(), " ",
              gate.scalar_type(), " and ", up.sizes(), " ", up.scalar_type());
}

at::Tensor swiglu_forward(const at::Tensor& gate_in, const at::Tensor& up_in) {
  const c10::DeviceGuard guard(gate_in.device());
  check_pair(gate_in, up_in);
  const at::Tensor gate = gate_in.contiguous();
  const at::Tensor up = up_in.contiguous();
  at::Tensor y = at::empty_like(gate);
  check_launch(mf::swiglu_forward(gate.data_ptr(), up.data_ptr(), y.data_ptr(), gate.numel(),
                                  dtype_of(gate, "gate"), current_stream()),
               "swiglu forward");
  return y;
}

std::vector<at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_in,
                                        const at::Tensor& up_in) {
  const c10::DeviceGuard guard(gate_in.device());
  check_pair(gate_in, up_in);
  const at::Tensor gate = gate_in.contiguous();
  const at::Tensor up = up_in.contiguous();
  const at::Tensor dy = grad.contiguous().to(gate.scalar_type());
  at::Tensor dgate = at::empty_like(gate);
  at::Tensor dup = at::empty_like(up);
  check_launch(mf::swiglu_backward(dy.data_ptr(), gate.data_ptr(), up.data_ptr(),
                                   dgate.data_ptr(), dup.data_ptr(), gate.numel(),
                                   dtype_of(gate, "gate"), current_stream()),
               "swiglu backward");
  return {dgate, dup};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused bias+GeLU (tanh) and SwiGLU (megatron-frontier)";
  m.def("bias_gelu_forward", &gelu_forward);
  m.def("bias_gelu_backward", &gelu_backward);
  m.def("swiglu_forward", &swiglu_forward);
  m.def("swiglu_backward", &swiglu_backward);
}
