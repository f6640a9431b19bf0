// Helpers shared by the torch bindings: dtype mapping, device and launch checks, the stream.
// Only binding files include torch; device code stays torch-free (see csrc/kernels/launch.h).
#pragma once

// Not <torch/extension.h>: it pulls in the whole C++ frontend (torch/all.h: nn, optim, data),
// which took each binding 32-34 s of g++ -O3 -g0 where these take 12-15 (benchmarks/results/
// kernel_build_times.md); pybind.h holds the at::Tensor <-> Python caster the module needs.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/utils/pybind.h>

#include "../kernels/launch.h"

namespace mf_binding {

inline mf::DType dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return mf::DType::kF32;
    case at::kHalf: return mf::DType::kF16;
    case at::kBFloat16: return mf::DType::kBF16;
    default:
      TORCH_CHECK(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
  return mf::DType::kF32;
}

inline void check_gpu(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be on a GPU, got ", t.device());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", expected ",
              like.device());
}

inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": kernel launch failed: ", cudaGetErrorString(err));
}

inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }

inline const float* float_ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

}  // namespace mf_binding
