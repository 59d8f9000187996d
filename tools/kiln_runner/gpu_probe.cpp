#include "gpu_probe.h"

#include <dlfcn.h>

#include <cuda_runtime_api.h>

namespace kiln::tools {

namespace {

// libcudart loads the driver by this name at its first call; the runner does
// not link it (tools/kiln_runner/CMakeLists.txt).
bool driver_loadable() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  dlclose(driver);
  return true;
}

}  // namespace

std::string describe_missing_gpu() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) return "";
  if (error == cudaSuccess) return "the CUDA runtime sees no GPU";
  (void)cudaGetLastError();
  const std::string says = std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
  if (!driver_loadable())
    return "no NVIDIA driver: libcuda.so.1 cannot be loaded (CUDA says " + says + ")";
  return "cudaGetDeviceCount failed with " + says;
}

}  // namespace kiln::tools
