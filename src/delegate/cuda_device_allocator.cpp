#include "delegate/cuda_device_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include <executorch/runtime/platform/log.h>

#include "delegate/status_to_error.h"
#include "runtime/cuda_check.h"

namespace kiln::delegate {

namespace et = executorch::runtime;
using et::Error;
using et::etensor::DeviceIndex;

namespace {

constexpr size_t kCudaMallocAlignment = 256;

// Runs `op` with device `index` current, then puts the caller's device back
// (ExecuTorch may call from a thread that is using another GPU).
template <typename Op>
kiln::Status on_device(DeviceIndex index, Op&& op) {
  int previous = 0;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  if (previous != index) KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
  kiln::Status status = op();
  if (previous != index) {
    cudaError_t error = cudaSetDevice(previous);
    if (status.is_ok() && error != cudaSuccess)
      return runtime::cuda_error_status(error, "cudaSetDevice(previous)", __FILE__, __LINE__);
  }
  return status;
}

}  // namespace

CudaDeviceAllocator& CudaDeviceAllocator::instance() {
  static CudaDeviceAllocator* const allocator = new CudaDeviceAllocator();
  return *allocator;
}

et::Result<void*> CudaDeviceAllocator::allocate(size_t nbytes, DeviceIndex index,
                                                size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
      alignment > kCudaMallocAlignment) {
    ET_LOG(Error,
           "CudaDeviceAllocator: alignment %zu is not supported (a power of two up to %zu)",
           alignment, kCudaMallocAlignment);
    return Error::InvalidArgument;
  }
  void* ptr = nullptr;
  // A zero-byte request still gets a real (non-null) allocation.
  kiln::Status status = on_device(index, [&]() -> kiln::Status {
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, std::max<size_t>(nbytes, 1)));
    return kiln::Status::ok();
  });
  if (!status.is_ok()) return to_executorch_error(status, "CudaDeviceAllocator: allocate failed");
  return ptr;
}

void CudaDeviceAllocator::deallocate(void* ptr, DeviceIndex index) {
  if (ptr == nullptr) return;
  kiln::Status status = on_device(index, [&]() -> kiln::Status {
    KILN_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
    return kiln::Status::ok();
  });
  if (!status.is_ok()) (void)to_executorch_error(status, "CudaDeviceAllocator: deallocate failed");
}

Error CudaDeviceAllocator::copy_host_to_device(void* dst, const void* src, size_t nbytes,
                                               DeviceIndex index) {
  if (nbytes == 0) return Error::Ok;
  kiln::Status status = on_device(index, [&]() -> kiln::Status {
    KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
    return kiln::Status::ok();
  });
  return to_executorch_error(status, "CudaDeviceAllocator: copy_host_to_device failed");
}

Error CudaDeviceAllocator::copy_device_to_host(void* dst, const void* src, size_t nbytes,
                                               DeviceIndex index) {
  if (nbytes == 0) return Error::Ok;
  kiln::Status status = on_device(index, [&]() -> kiln::Status {
    KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
    return kiln::Status::ok();
  });
  return to_executorch_error(status, "CudaDeviceAllocator: copy_device_to_host failed");
}

namespace {

// Registered when the library loads; no CUDA call happens here, so loading
// works on a machine without a GPU. The registry aborts on a second
// registration for a device type, so step aside if one is already there.
const bool kAllocatorRegistered = [] {
  if (et::get_device_allocator(et::etensor::DeviceType::CUDA) != nullptr) return false;
  et::register_device_allocator(&CudaDeviceAllocator::instance());
  return true;
}();

}  // namespace

bool cuda_device_allocator_registered() {
  return kAllocatorRegistered &&
         et::get_device_allocator(et::etensor::DeviceType::CUDA) ==
             &CudaDeviceAllocator::instance();
}

}  // namespace kiln::delegate
