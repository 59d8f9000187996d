#include "device_io.h"

#include <cuda_runtime_api.h>

#include <cstring>

namespace kiln::tools {
namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;

std::string cuda_error(const char* what, cudaError_t error) {
  return std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
}

}  // namespace

bool to_dtype(ScalarType type, engine::DType* out) {
  switch (type) {
    case ScalarType::Float: *out = engine::DType::kFloat32; return true;
    case ScalarType::Half: *out = engine::DType::kFloat16; return true;
    case ScalarType::BFloat16: *out = engine::DType::kBFloat16; return true;
    case ScalarType::Long: *out = engine::DType::kInt64; return true;
    case ScalarType::Int: *out = engine::DType::kInt32; return true;
    case ScalarType::Bool: *out = engine::DType::kBool; return true;
    default: return false;
  }
}

ScalarType to_scalar_type(engine::DType dtype) {
  switch (dtype) {
    case engine::DType::kFloat32: return ScalarType::Float;
    case engine::DType::kFloat16: return ScalarType::Half;
    case engine::DType::kBFloat16: return ScalarType::BFloat16;
    case engine::DType::kInt64: return ScalarType::Long;
    case engine::DType::kInt32: return ScalarType::Int;
    case engine::DType::kBool: return ScalarType::Bool;
  }
  return ScalarType::Float;
}

DeviceIo::~DeviceIo() {
  tensors_.clear();
  for (void* p : buffers_) cudaFree(p);
}

void* DeviceIo::allocate(size_t nbytes, std::string* error) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
  if (e != cudaSuccess) {
    *error = cuda_error("cudaMalloc", e);
    return nullptr;
  }
  buffers_.push_back(p);
  return p;
}

std::string DeviceIo::prepare(executorch::extension::module::Module& module, const std::string& method,
                              const std::vector<HostTensor>& inputs) {
  const executorch::aten::Device cuda(executorch::aten::DeviceType::CUDA, 0);
  std::string error;
  for (const HostTensor& t : inputs) {
    void* p = allocate(t.data.size(), &error);
    if (!p) return "input " + std::to_string(tensors_.size()) + ": " + error;
    cudaError_t e = cudaMemcpy(p, t.data.data(), t.data.size(), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cuda_error("cudaMemcpy (input upload)", e);
    std::vector<executorch::aten::SizesType> sizes(t.shape.begin(), t.shape.end());
    tensors_.push_back(executorch::extension::make_tensor_ptr(std::move(sizes), p, to_scalar_type(t.dtype), cuda));
    input_values_.emplace_back(*tensors_.back());
  }
  et::Result<et::MethodMeta> meta = module.method_meta(method);
  if (!meta.ok()) return "cannot read the method's metadata";
  for (size_t i = 0; i < meta->num_outputs(); ++i) {
    et::Result<et::TensorInfo> info = meta->output_tensor_meta(i);
    if (!info.ok()) return "output " + std::to_string(i) + " is not a tensor";
    void* p = allocate(info->nbytes(), &error);
    if (!p) return "output " + std::to_string(i) + ": " + error;
    std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(), info->sizes().end());
    tensors_.push_back(executorch::extension::make_tensor_ptr(std::move(sizes), p, info->scalar_type(), cuda));
    et::Error set = module.set_output(method, et::EValue(*tensors_.back()), i);
    if (set != et::Error::Ok)
      return "Module::set_output(" + std::to_string(i) + ") failed (error " +
             std::to_string(static_cast<int>(set)) +
             "); was the program exported with alloc_graph_output=False?";
  }
  return "";
}

std::string copy_to_host(const executorch::aten::Tensor& tensor, std::vector<uint8_t>* out) {
  out->resize(tensor.nbytes());
  return copy_to_host(tensor, out->data(), out->size());
}

std::string copy_to_host(const executorch::aten::Tensor& tensor, void* dst, size_t nbytes) {
  if (tensor.nbytes() != nbytes)
    return "copy to host: the tensor holds " + std::to_string(tensor.nbytes()) +
           " bytes, the destination " + std::to_string(nbytes);
  if (nbytes == 0) return "";
  if (tensor.device_type() == executorch::aten::DeviceType::CPU) {
    std::memcpy(dst, tensor.const_data_ptr(), nbytes);
    return "";
  }
  cudaError_t e = cudaMemcpy(dst, tensor.const_data_ptr(), nbytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? "" : cuda_error("cudaMemcpy (output download)", e);
}

std::string copy_bytes_to_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return "";
  cudaError_t e = cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault);
  return e == cudaSuccess ? "" : cuda_error("cudaMemcpy (to host)", e);
}

std::string synchronize_per_thread_stream() {
  cudaError_t e = cudaStreamSynchronize(cudaStreamPerThread);
  return e == cudaSuccess ? "" : cuda_error("cudaStreamSynchronize (cudaStreamPerThread)", e);
}

void synchronize_device() { (void)cudaDeviceSynchronize(); }

}  // namespace kiln::tools
