// A CPU stand-in for the CUDA runtime, just enough to execute csrc/kernels on the host: each
// block runs as real threads (a reused pool), __syncthreads is a block barrier, __shared__ is a
// function-local static (blocks run one at a time), and lane shuffles exchange through a
// per-warp buffer between two warp barriers. Built once with 32 and once with 64 lanes, it
// exercises the reductions at both the NVIDIA and the CDNA width. Test-only code.
#pragma once

#ifndef MF_WARP_SIZE
#error "build the simulator with -DMF_WARP_SIZE=32 or 64"
#endif

#include <barrier>
#include <atomic>
#include <functional>
#include <semaphore>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }

namespace mf_sim {

inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<float> lanes;  // one slot per thread of the block
inline thread_local int linear_id = 0;
constexpr int warp_width = MF_WARP_SIZE;
inline cudaError_t last_error = cudaSuccess;

inline float shfl_xor(float v, int lane_mask) {
  const int warp = linear_id / warp_width, lane = linear_id % warp_width;
  std::barrier<>& bar = *warp_barriers[warp];
  lanes[linear_id] = v;
  bar.arrive_and_wait();
  const float other = lanes[warp * warp_width + (lane ^ lane_mask)];
  bar.arrive_and_wait();
  return other;
}

// Up to 1024 worker threads, created once and reused for every block: creating a thread per
// simulated GPU thread made the tests slow. Never destroyed (threads may still wait at exit).
class Pool {
 public:
  void run(int n, const std::function<void(int)>& job) {
    while (static_cast<int>(workers_.size()) < n) {
      auto* go = new std::binary_semaphore(0);
      const int id = static_cast<int>(workers_.size());
      workers_.push_back(go);
      std::thread([this, go, id] { loop(go, id); }).detach();
    }
    job_ = &job;
    pending_ = n;
    for (int i = 0; i < n; ++i) workers_[i]->release();  // wake only the threads this block has
    done_.acquire();
  }

 private:
  void loop(std::binary_semaphore* go, int id) {
    for (;;) {
      go->acquire();
      (*job_)(id);
      if (pending_.fetch_sub(1) == 1) done_.release();
    }
  }

  std::vector<std::binary_semaphore*> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<int> pending_{0};
  std::binary_semaphore done_{0};
};

inline Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

template <class... P, class... A>
void launch(dim3 grid, dim3 block, int, cudaStream_t, void (*kernel)(P...), A&&... args) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  if (n < 1 || n > 1024 || grid.x == 0) {
    last_error = cudaErrorInvalidValue;
    return;
  }
  gridDim = grid;
  blockDim = block;
  lanes.assign(n, 0.0f);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> bar(n);
        block_barrier = &bar;
        warp_barriers.clear();
        for (int w = 0; w * warp_width < n; ++w) {
          const int width = std::min(warp_width, n - w * warp_width);
          warp_barriers.push_back(std::make_unique<std::barrier<>>(width));
        }
        pool().run(n, [&](int t) {
          linear_id = t;
          blockIdx = dim3(bx, by, bz);
          threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
          kernel(args...);
          // A finished thread must not hold up barriers the others still reach.
          warp_barriers[t / warp_width]->arrive_and_drop();
          bar.arrive_and_drop();
        });
      }
}

}  // namespace mf_sim

inline void __syncthreads() { mf_sim::block_barrier->arrive_and_wait(); }
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = mf_sim::last_error;
  mf_sim::last_error = cudaSuccess;
  return e;
}
