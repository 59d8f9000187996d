// Borrowed GPU resources for load-time algorithm searches (steps/conv_step_exec.cpp,
// steps/gemm_step_exec.cpp): a private non-blocking stream and zeroed scratch buffers
// on which candidates run. Freed with the object, on every path out of the
// search; never used on the execute path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "runtime/cuda_check.h"

namespace kiln::runtime {

class LoadScratch {
 public:
  LoadScratch() = default;
  ~LoadScratch() {
    for (void* p : buffers_) (void)cudaFree(p);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  LoadScratch(const LoadScratch&) = delete;
  LoadScratch& operator=(const LoadScratch&) = delete;

  // The private stream, created on first call.
  Result<cudaStream_t> stream() {
    if (stream_ == nullptr)
      KILN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return stream_;
  }

  // A zeroed device buffer of `bytes` plus 256 bytes of slack, so an operand
  // can be placed at exactly its real alignment (aligned_like).
  Result<uint8_t*> allocate(size_t bytes) {
    void* p = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes + 256));
    buffers_.push_back(p);
    KILN_CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, bytes + 256));
    return static_cast<uint8_t*>(p);
  }

  // `base` (256-byte aligned) moved so its address has exactly `alignment`
  // (a power of two <= 256).
  static uint8_t* aligned_like(uint8_t* base, uint32_t alignment) {
    return alignment >= 256 ? base : base + alignment;
  }

  // min(`limit`, a quarter of the GPU's free memory): a search workspace cap.
  static Result<size_t> workspace_cap(size_t limit) {
    size_t free_bytes = 0, total_bytes = 0;
    KILN_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes / 4 < limit ? free_bytes / 4 : limit;
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};

}  // namespace kiln::runtime
