#include "runtime/device.h"

#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"

namespace kiln::runtime {

Status check_gpu_available() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return make_status(StatusCode::kUnavailable,
                       "no CUDA GPU: cudaGetDeviceCount returned %s (%s)",
                       cudaGetErrorString(error), cudaGetErrorName(error));
  }
  if (count <= 0)
    return make_status(StatusCode::kUnavailable,
                       "no CUDA GPU: cudaGetDeviceCount found 0 devices");
  return Status::ok();
}

Result<DeviceInfo> query_device(int ordinal) {
  KILN_RETURN_IF_ERROR(check_gpu_available());
  int count = 0;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (ordinal < 0 || ordinal >= count)
    return make_status(StatusCode::kInvalidArgument,
                       "CUDA device %d does not exist (this machine has %d)", ordinal, count);
  cudaDeviceProp prop{};
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.sm = prop.major * 10 + prop.minor;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.total_memory_bytes = prop.totalGlobalMem;
  info.max_shared_per_block_optin = prop.sharedMemPerBlockOptin;
  return info;
}

Result<int> current_device() {
  int device = 0;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  return device;
}

Status ensure_current_device(int ordinal) {
  int device = -1;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device != ordinal) KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return Status::ok();
}

}  // namespace kiln::runtime
