// ExecuTorch's DeviceAllocator for CUDA memory, registered once when the
// delegate library loads so programs whose memory plan puts buffers on a CUDA
// device can be loaded. Plain CUDA runtime calls; errors are logged and
// returned, never thrown or aborted on.
#pragma once

#include <cstddef>

#include <executorch/runtime/core/device_allocator.h>

#ifndef KILN_DELEGATE_API
#define KILN_DELEGATE_API __attribute__((visibility("default")))
#endif

namespace kiln::delegate {

class KILN_DELEGATE_API CudaDeviceAllocator final : public executorch::runtime::DeviceAllocator {
 public:
  // The process-wide instance (never destroyed: the registry keeps a pointer).
  static CudaDeviceAllocator& instance();

  // cudaMalloc on device `index` (its base is 256-byte aligned, so alignments
  // up to 256 are honoured; larger ones are refused with InvalidArgument).
  executorch::runtime::Result<void*> allocate(
      size_t nbytes, executorch::runtime::etensor::DeviceIndex index,
      size_t alignment = kDefaultAlignment) override;
  void deallocate(void* ptr, executorch::runtime::etensor::DeviceIndex index) override;
  // Synchronous cudaMemcpy.
  executorch::runtime::Error copy_host_to_device(
      void* dst, const void* src, size_t nbytes,
      executorch::runtime::etensor::DeviceIndex index) override;
  executorch::runtime::Error copy_device_to_host(
      void* dst, const void* src, size_t nbytes,
      executorch::runtime::etensor::DeviceIndex index) override;
  executorch::runtime::etensor::DeviceType device_type() const override {
    return executorch::runtime::etensor::DeviceType::CUDA;
  }

 private:
  CudaDeviceAllocator() = default;
};

// True when this library's allocator is the registered CUDA allocator (false
// when another library, e.g. ExecuTorch's own CUDA backend, registered first).
KILN_DELEGATE_API bool cuda_device_allocator_registered();

}  // namespace kiln::delegate
