// Loading and running a method: inputs checked against the signature before
// anything is loaded (so a wrong tensor is named even without a GPU), then
// ExecuTorch's Method driven directly. Nothing is allocated on the success
// path of set_input / set_output / execute / output, except a new view of an
// input whose shape changed (a program exported with dynamic shapes).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <cuda_runtime_api.h>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/platform/log.h>

#include "c_api_internal.h"
#include "program_check.h"  // tools/kiln_runner (kiln_runner_support)

namespace et = executorch::runtime;

namespace kiln::c_api {
namespace {

constexpr uintptr_t kCudaAlignment = 256;  // cudaMalloc's; the Kiln delegate requires it

std::string et_error(et::Error error) {
  char text[96];
  std::snprintf(text, sizeof(text), "ExecuTorch error %s (0x%x)", et::to_string(error),
                static_cast<unsigned>(error));
  return text;
}

std::string cuda_error(const char* what, cudaError_t error) {
  return std::string(what) + " failed: " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
}

// Checks a caller's tensor against slot `s`; the message names the tensor and
// says what was expected and what was given.
kiln_status check_tensor(const MethodState& ms, const char* what, size_t index, const IoSlot& s,
                         const kiln_tensor* t) {
  if (t == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "the tensor is NULL");
  if (!s.is_tensor)
    return fail(KILN_ERROR_NOT_SUPPORTED, ms.where(what, index) + "is not a tensor in the program; this API feeds tensors only");
  if (t->ndim < 0 || t->ndim > KILN_MAX_DIMS || (t->ndim > 0 && t->shape == nullptr))
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "bad tensor: ndim " + std::to_string(t->ndim) +
                                                 (t->shape == nullptr ? " with a NULL shape" : ""));
  bool same = t->dtype == s.dtype && static_cast<size_t>(t->ndim) == s.shape.size() &&
              t->device_type == s.device_type &&
              (s.device_type != KILN_DEVICE_CUDA || t->device_index == s.device_index);
  // An input may be smaller than the signature's shape (dynamic shapes,
  // program_check.h); an output buffer must have it.
  if (same && std::strcmp(what, "input") == 0)
    same = kiln::tools::fits_planned_shape(t->shape, static_cast<size_t>(t->ndim), s.shape);
  else if (same)
    same = std::equal(s.shape.begin(), s.shape.end(), t->shape);
  if (!same) {
    std::string hint;
    if (t->device_type != s.device_type)
      hint = s.device_type == KILN_DEVICE_CUDA
                 ? " (the program was exported with device-resident I/O: pass CUDA memory)"
                 : " (the program takes host memory here: pass a host tensor)";
    return fail(KILN_ERROR_INVALID_ARGUMENT,
                ms.where(what, index) + "expected " +
                    describe(s.dtype, s.shape.data(), static_cast<int32_t>(s.shape.size()), s.device_type, s.device_index) +
                    ", got " + describe(t->dtype, t->shape, t->ndim, t->device_type, t->device_index) + hint);
  }
  if (t->data == nullptr && s.nbytes > 0)
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "the data pointer is NULL");
  if (t->device_type == KILN_DEVICE_CUDA && reinterpret_cast<uintptr_t>(t->data) % kCudaAlignment != 0)
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "CUDA memory must be 256-byte aligned (as cudaMalloc "
                                                 "returns it); this pointer is not (a view at an offset?)");
  return ok();
}

// Points input slot `s` at a tensor of the caller's (smaller, dynamic) shape:
// contiguous strides and a new TensorImpl over them; only when the shape
// changes from the last call.
void reshape_input(IoSlot& s, const kiln_tensor* t) {
  executorch::aten::StridesType stride = 1;
  for (size_t d = s.sizes.size(); d-- > 0;) {
    s.sizes[d] = static_cast<executorch::aten::SizesType>(t->shape[d]);
    s.strides[d] = stride;
    stride *= s.sizes[d];
  }
  s.impl = std::make_unique<executorch::aten::TensorImpl>(
      s.impl->scalar_type(), static_cast<ssize_t>(s.sizes.size()), s.sizes.data(), nullptr, s.dim_order.data(),
      s.strides.data(), executorch::aten::TensorShapeDynamism::STATIC, s.impl->device_type(), s.impl->device_index());
}

// Allocates the method's own buffer for an output the program leaves to the
// caller (device-resident I/O) and points the method at it.
kiln_status provide_output(MethodState& ms, size_t i) {
  IoSlot& s = ms.outputs[i];
  if (s.device_type == KILN_DEVICE_CUDA) {
    int previous = 0;
    cudaError_t e = cudaGetDevice(&previous);
    if (e == cudaSuccess) e = cudaSetDevice(s.device_index);
    if (e != cudaSuccess) return fail(KILN_ERROR_CUDA, ms.where("output", i) + cuda_error("cudaSetDevice", e));
    std::string why;
    s.own_buffer = ms.device_buffers.allocate(s.nbytes, &why);
    e = cudaSetDevice(previous);
    if (s.own_buffer == nullptr) return fail(KILN_ERROR_CUDA, ms.where("output", i) + why);
    if (e != cudaSuccess) return fail(KILN_ERROR_CUDA, ms.where("output", i) + cuda_error("cudaSetDevice", e));
  } else {
    s.host_buffer.assign(s.nbytes == 0 ? 1 : s.nbytes, 0);
    s.own_buffer = s.host_buffer.data();
  }
  et::Error error = ms.method->set_output_data_ptr(s.own_buffer, s.nbytes, i);
  if (error != et::Error::Ok)
    return fail(KILN_ERROR_LOAD, ms.where("output", i) + "ExecuTorch refused its buffer: " + et_error(error));
  return ok();
}

kiln_status load(MethodState& ms) {
  if (ms.method != nullptr) return ok();
  if (ms.uses_kiln) {
    const char* reason = nullptr;
    if (!kiln_gpu_available(&reason))
      return fail(KILN_ERROR_NO_GPU, "method '" + ms.name + "' runs on the GPU (KilnBackend), but this machine has "
                                     "no usable CUDA GPU (" + reason + ")");
  }
  ProgramState& ps = *ms.program;
  std::lock_guard<std::mutex> lock(ps.mutex);
  et::Result<et::MethodMeta> meta = ps.module->method_meta(ms.name);
  if (!meta.ok()) return fail(KILN_ERROR_LOAD, "cannot read method '" + ms.name + "': " + et_error(meta.error()));
  if (std::string why = kiln::tools::check_planned_memory(*meta, kiln::tools::physical_memory_bytes()); !why.empty())
    return fail(KILN_ERROR_LOAD, "cannot load method '" + ms.name + "': " + why);
  // The state scope travels as KilnBackend's load option (backend_options.h).
  et::BackendOptions<1> scope_option;
  et::LoadBackendOptionsMap load_options;
  if (!ps.state_scope.empty() &&
      (scope_option.set_option("state_scope", ps.state_scope.c_str()) != et::Error::Ok ||
       load_options.set_options(kKilnBackendName, scope_option.view()) != et::Error::Ok))
    return fail(KILN_ERROR_LOAD, "cannot load method '" + ms.name + "': its state scope does not fit a load option");
  et::Error error = ps.module->load_method(ms.name, nullptr, nullptr,
                                           ps.state_scope.empty() ? nullptr : &load_options);
  if (error == et::Error::Ok && ps.first_loaded.empty()) ps.first_loaded = ms.name;
  if (error != et::Error::Ok)
    return fail(KILN_ERROR_LOAD, "cannot load method '" + ms.name + "' of '" + ps.path + "': " + et_error(error) +
                                     " (ExecuTorch's log line above says why)");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  // Module::method is deprecated for apps; this binding drives the Method
  // itself so that setting inputs and executing allocate nothing.
  et::Result<et::Method*> method = ps.module->method(ms.name);
#pragma GCC diagnostic pop
  if (!method.ok()) return fail(KILN_ERROR_LOAD, "cannot get method '" + ms.name + "': " + et_error(method.error()));
  ms.method = *method;
  for (size_t i = 0; i < ms.outputs.size(); ++i) {
    if (!ms.outputs[i].is_tensor || ms.outputs[i].memory_planned) continue;
    if (kiln_status status = provide_output(ms, i); status != KILN_OK) {
      ms.method = nullptr;  // the Module keeps the loaded method; the next load retries the buffers
      return status;
    }
  }
  for (IoSlot& s : ms.inputs) s.set = false;
  ET_LOG(Info, "kiln_c_api: method '%s' loaded (%zu inputs, %zu outputs%s)", ms.name.c_str(), ms.inputs.size(),
         ms.outputs.size(), ms.any_device_io ? ", device-resident I/O" : "");
  return ok();
}

}  // namespace
}  // namespace kiln::c_api

using namespace kiln::c_api;  // NOLINT: the C entry points below

extern "C" {

kiln_status kiln_method_load(kiln_method* method) {
  if (method == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_load: NULL method");
  return load(*method->state);
}

kiln_status kiln_method_set_input(kiln_method* method, size_t index, const kiln_tensor* tensor) {
  if (method == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_set_input: NULL method");
  MethodState& ms = *method->state;
  if (index >= ms.inputs.size())
    return fail(KILN_ERROR_INVALID_ARGUMENT, "method '" + ms.name + "' takes " + std::to_string(ms.inputs.size()) +
                                                 " inputs, no input " + std::to_string(index));
  IoSlot& s = ms.inputs[index];
  if (kiln_status status = check_tensor(ms, "input", index, s, tensor); status != KILN_OK) return status;
  if (kiln_status status = load(ms); status != KILN_OK) return status;
  if (!std::equal(s.sizes.begin(), s.sizes.end(), tensor->shape)) reshape_input(s, tensor);
  s.impl->set_data(tensor->data);
  et::Error error = ms.method->set_input(et::EValue(executorch::aten::Tensor(s.impl.get())), index);
  if (error != et::Error::Ok)
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where("input", index) + "ExecuTorch refused it: " + et_error(error));
  s.set = true;
  return ok();
}

kiln_status kiln_method_set_output(kiln_method* method, size_t index, const kiln_tensor* tensor) {
  if (method == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_set_output: NULL method");
  MethodState& ms = *method->state;
  if (index >= ms.outputs.size())
    return fail(KILN_ERROR_INVALID_ARGUMENT, "method '" + ms.name + "' has " + std::to_string(ms.outputs.size()) +
                                                 " outputs, no output " + std::to_string(index));
  IoSlot& s = ms.outputs[index];
  if (tensor == nullptr && (s.memory_planned || !s.is_tensor)) return ok();  // already the program's own
  if (s.memory_planned || !s.is_tensor)
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where("output", index) + "the program places this output itself; only "
                                                 "outputs of a program saved with device-resident I/O take the caller's memory");
  if (tensor != nullptr)
    if (kiln_status status = check_tensor(ms, "output", index, s, tensor); status != KILN_OK) return status;
  if (kiln_status status = load(ms); status != KILN_OK) return status;
  void* data = tensor != nullptr ? tensor->data : s.own_buffer;
  et::Error error = ms.method->set_output_data_ptr(data, s.nbytes, index);
  if (error != et::Error::Ok)
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where("output", index) + "ExecuTorch refused the buffer: " + et_error(error));
  return ok();
}

kiln_status kiln_method_execute(kiln_method* method) {
  if (method == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_execute: NULL method");
  MethodState& ms = *method->state;
  if (kiln_status status = load(ms); status != KILN_OK) return status;
  for (size_t i = 0; i < ms.inputs.size(); ++i)
    if (ms.inputs[i].is_tensor && !ms.inputs[i].set)
      return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where("input", i) + "not set (every input must be set before the "
                                                   "first execution)");
  ms.executed = false;
  et::Error error = ms.method->execute();
  if (error != et::Error::Ok)
    return fail(KILN_ERROR_EXECUTE, "method '" + ms.name + "': execute failed: " + et_error(error) +
                                        " (the delegate's log line above says why)");
  if (ms.any_device_io) {
    // Device outputs are read by other libraries on their own streams: finish
    // the work first (the delegate ran on this thread's cudaStreamPerThread).
    if (std::string why = kiln::tools::synchronize_per_thread_stream(); !why.empty())
      return fail(KILN_ERROR_CUDA, "method '" + ms.name + "': " + why);
  }
  ms.executed = true;
  return ok();
}

kiln_status kiln_method_output(const kiln_method* method, size_t index, kiln_tensor* out) {
  if (method == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_output: NULL argument");
  const MethodState& ms = *method->state;
  if (index >= ms.outputs.size())
    return fail(KILN_ERROR_INVALID_ARGUMENT, "method '" + ms.name + "' has " + std::to_string(ms.outputs.size()) +
                                                 " outputs, no output " + std::to_string(index));
  if (!ms.executed || ms.method == nullptr)
    return fail(KILN_ERROR_INVALID_ARGUMENT, "method '" + ms.name + "': no outputs yet (execute it first)");
  const et::EValue& value = ms.method->get_output(index);
  if (!value.isTensor())
    return fail(KILN_ERROR_NOT_SUPPORTED, ms.where("output", index) + "is not a tensor; this API returns tensors only");
  const executorch::aten::Tensor tensor = value.toTensor();
  IoSlot& s = const_cast<IoSlot&>(ms.outputs[index]);  // out_shape: storage for the caller's view
  if (tensor.dim() > KILN_MAX_DIMS)
    return fail(KILN_ERROR_NOT_SUPPORTED, ms.where("output", index) + "has more than 16 dims");
  for (ssize_t d = 0; d < tensor.dim(); ++d) s.out_shape[d] = tensor.size(d);
  out->data = tensor.mutable_data_ptr();
  out->dtype = static_cast<int32_t>(tensor.scalar_type());
  out->device_type = tensor.device_type() == executorch::aten::DeviceType::CUDA ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU;
  out->device_index = tensor.device_index();
  out->ndim = static_cast<int32_t>(tensor.dim());
  out->shape = s.out_shape.data();
  return ok();
}

kiln_status kiln_method_copy_output(const kiln_method* method, size_t index, void* dst, size_t nbytes) {
  kiln_tensor view;
  if (kiln_status status = kiln_method_output(method, index, &view); status != KILN_OK) return status;
  const MethodState& ms = *method->state;
  const executorch::aten::Tensor tensor = ms.method->get_output(index).toTensor();
  if (dst == nullptr && nbytes > 0) return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where("output", index) + "NULL destination");
  if (std::string why = kiln::tools::copy_to_host(tensor, dst, nbytes); !why.empty())
    return fail(view.device_type == KILN_DEVICE_CUDA ? KILN_ERROR_CUDA : KILN_ERROR_INVALID_ARGUMENT,
                ms.where("output", index) + why);
  return ok();
}

}  // extern "C"
