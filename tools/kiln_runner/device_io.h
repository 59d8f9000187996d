// --device_io: feeds a program exported with its inputs and outputs on the
// GPU (kiln.save(..., backend_config=<device-resident config>)). Inputs are
// copied once into CUDA buffers before timing; outputs are CUDA buffers the
// runner owns and hands to Module::set_output; nothing crosses to the host
// inside execute(), which the delegate's copy counters confirm.
#pragma once

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>

#include <string>
#include <vector>

#include "tensor_file.h"

namespace kiln::tools {

// ExecuTorch ScalarType <-> engine DType for the dtypes the runner handles;
// to_dtype is false for any other ScalarType.
bool to_dtype(executorch::aten::ScalarType type, engine::DType* out);
executorch::aten::ScalarType to_scalar_type(engine::DType dtype);

// Owns the device buffers (freed on destruction) and the tensors over them.
class DeviceIo {
 public:
  DeviceIo() = default;
  DeviceIo(const DeviceIo&) = delete;
  DeviceIo& operator=(const DeviceIo&) = delete;
  ~DeviceIo();

  // Uploads `inputs`, allocates one buffer per output of `method` and sets
  // them as its outputs. An empty string on success, else why not.
  std::string prepare(executorch::extension::module::Module& module, const std::string& method,
                      const std::vector<HostTensor>& inputs);

  const std::vector<executorch::runtime::EValue>& input_values() const { return input_values_; }

  // cudaMalloc on the current device (1 byte for an empty tensor), owned by
  // this object until it is destroyed; nullptr with *error set on failure.
  void* allocate(size_t nbytes, std::string* error);

 private:

  std::vector<void*> buffers_;
  std::vector<executorch::extension::TensorPtr> tensors_;
  std::vector<executorch::runtime::EValue> input_values_;
};

// Copies a tensor's bytes to the host whether it lives on the CPU or a CUDA
// device. An empty string on success.
std::string copy_to_host(const executorch::aten::Tensor& tensor, std::vector<uint8_t>* out);

// The same into `dst`, which holds `nbytes` bytes: the tensor's size must be
// exactly that. Allocates nothing.
std::string copy_to_host(const executorch::aten::Tensor& tensor, void* dst, size_t nbytes);

// Copies `nbytes` from `src`, host or CUDA memory (cudaMemcpyDefault, unified
// addressing), to host memory `dst`. An empty string on success.
std::string copy_bytes_to_host(void* dst, const void* src, size_t nbytes);

// Waits for the work this thread queued on cudaStreamPerThread (where the Kiln
// delegate runs when no kiln::CallerStreamGuard is live). An empty string on
// success, else the CUDA error.
std::string synchronize_per_thread_stream();

// Waits for all work on the current device (timing device-resident runs).
void synchronize_device();

}  // namespace kiln::tools
