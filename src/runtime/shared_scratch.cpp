#include "runtime/shared_scratch.h"

#include <cuda_runtime_api.h>

#include <map>

#include "runtime/cuda_check.h"
#include "runtime/device.h"

namespace kiln::runtime {

std::shared_ptr<SharedScratch> SharedScratch::for_device(int device) {
  static std::mutex* const registry_mutex = new std::mutex();
  static auto* const registry = new std::map<int, std::weak_ptr<SharedScratch>>();
  std::lock_guard<std::mutex> lock(*registry_mutex);
  std::weak_ptr<SharedScratch>& slot = (*registry)[device];
  std::shared_ptr<SharedScratch> scratch = slot.lock();
  if (scratch == nullptr) {
    scratch.reset(new SharedScratch(device));
    slot = scratch;
  }
  return scratch;
}

SharedScratch::~SharedScratch() {
  if (buffer_ != nullptr) {
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) {
      (void)cudaSetDevice(device_);
      (void)cudaFree(buffer_);
      (void)cudaSetDevice(previous);
    } else {
      (void)cudaFree(buffer_);
    }
  }
  (void)cudaGetLastError();
}

Result<void*> SharedScratch::acquire(size_t bytes) {
  if (bytes <= capacity_ && buffer_ != nullptr) return buffer_;
  KILN_RETURN_IF_ERROR(ensure_current_device(device_));
  if (buffer_ != nullptr) {
    KILN_CUDA_RETURN_IF_ERROR(cudaFree(buffer_));
    buffer_ = nullptr;
    capacity_ = 0;
  }
  void* fresh = nullptr;
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&fresh, bytes));
  buffer_ = fresh;
  capacity_ = bytes;
  return buffer_;
}

}  // namespace kiln::runtime
