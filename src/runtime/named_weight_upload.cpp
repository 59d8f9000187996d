// The process's NamedWeightCache and StateRegistry over CUDA
// (named_weight_cache.h, state_registry.h).
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/named_weight_cache.h"
#include "runtime/state_registry.h"

namespace kiln::runtime {
namespace {

class CudaMemoryOps : public DeviceMemoryOps {
 public:
  Result<void*> upload(int device, const void* host, size_t size) override {
    KILN_RETURN_IF_ERROR(ensure_current_device(device));
    void* data = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, size));
    const cudaError_t copied = cudaMemcpy(data, host, size, cudaMemcpyHostToDevice);
    if (copied != cudaSuccess) {
      (void)cudaFree(data);
      return cuda_error_status(copied, "cudaMemcpy(named weight)", __FILE__, __LINE__);
    }
    return data;
  }
  void release(int device, void* data) override {
    int current = -1;
    const bool restore = cudaGetDevice(&current) == cudaSuccess && current != device;
    if (restore) (void)cudaSetDevice(device);
    (void)cudaFree(data);
    if (restore) (void)cudaSetDevice(current);
    (void)cudaGetLastError();  // leave no error behind for the caller's next check
  }
};

}  // namespace

NamedWeightCache& process_named_weight_cache() {
  static CudaMemoryOps* const ops = new CudaMemoryOps();
  static NamedWeightCache* const cache = new NamedWeightCache(ops);
  return *cache;
}

StateRegistry& process_state_registry() {
  static CudaMemoryOps* const ops = new CudaMemoryOps();
  static StateRegistry* const registry = new StateRegistry(ops);  // leaked, as the cache
  return *registry;
}

}  // namespace kiln::runtime
