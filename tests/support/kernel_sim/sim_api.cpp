// C entry points over the launchers in csrc/kernels/instantiate, for ctypes. Test-only code.
#include "launch.h"

// Both widths' libraries live in one test process: everything but this API is hidden (and
// built with -fno-gnu-unique) so that neither library binds to the other's inline state.
#define SIM_API __attribute__((visibility("default")))

extern "C" {

SIM_API int sim_warp_size() { return MF_WARP_SIZE; }

SIM_API int sim_softmax(int backward, const void* a, const void* b, void* out, const uint8_t* mask,
                int64_t rows, int64_t heads, int64_t sq, int64_t sk, int64_t msb, int64_t msh,
                int64_t msq, float scale, int causal, int dtype) {
  const mf::SoftmaxShape s{rows, heads, sq, sk, msb, msh, msq};
  const auto d = static_cast<mf::DType>(dtype);
  return backward ? mf::softmax_backward(a, b, out, mask, s, scale, causal, d, nullptr)
                  : mf::softmax_forward(a, out, mask, s, scale, causal, d, nullptr);
}

SIM_API int sim_norm_forward(const void* x, const void* g, const void* b, void* y, float* mean,
                     float* rstd, int64_t rows, int64_t n, float eps, int rms, int xd, int wd) {
  return mf::norm_forward(x, g, b, y, mean, rstd, rows, n, eps, rms,
                          static_cast<mf::DType>(xd), static_cast<mf::DType>(wd), nullptr);
}

SIM_API int64_t sim_norm_chunks(int64_t rows, int64_t n, int sms) {
  return mf::norm_weight_grad_chunks(rows, n, sms);
}

SIM_API int sim_norm_backward(const void* dy, const void* x, const void* g, const float* mean,
                      const float* rstd, void* dx, float* gp, float* bp, int64_t chunks,
                      int64_t rows, int64_t n, int rms, int xd, int wd) {
  return mf::norm_backward(dy, x, g, mean, rstd, dx, gp, bp, chunks, rows, n, rms,
                           static_cast<mf::DType>(xd), static_cast<mf::DType>(wd), nullptr);
}

SIM_API int sim_rotary(const void* x, const float* c, const float* s, void* y, int64_t len,
               int64_t rows_per_s, int64_t d, int backward, int dtype) {
  return mf::rotary(x, c, s, y, len, rows_per_s, d, backward, static_cast<mf::DType>(dtype),
                    nullptr);
}

SIM_API int sim_gelu(int backward, const void* dy, const void* x, const float* bias, void* out,
             int64_t numel, int64_t n, int dtype) {
  const auto d = static_cast<mf::DType>(dtype);
  return backward ? mf::bias_gelu_backward(dy, x, bias, out, numel, n, d, nullptr)
                  : mf::bias_gelu_forward(x, bias, out, numel, n, d, nullptr);
}

SIM_API int sim_swiglu(int backward, const void* dy, const void* g, const void* u, void* o0, void* o1,
               int64_t numel, int dtype) {
  const auto d = static_cast<mf::DType>(dtype);
  return backward ? mf::swiglu_backward(dy, g, u, o0, o1, numel, d, nullptr)
                  : mf::swiglu_forward(g, u, o0, numel, d, nullptr);
}

}  // extern "C"
