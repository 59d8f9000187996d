// Checks of the delegate's arguments against an engine's inputs and outputs,
// and the choice of a shape variant; every refusal logs one line naming the
// argument, what the engine expects and what it got (io_checks.h).
#include "delegate/io_checks.h"

#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdio>

#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>

namespace kiln::delegate {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using et::Error;
using et::EValue;
using kiln::engine::DType;

namespace {

// Appends "[8, 512]" to `buffer` (a fixed buffer: execute() must not allocate).
template <typename Dims>
void format_dims(char* buffer, size_t capacity, const Dims& dims) {
  size_t used = std::snprintf(buffer, capacity, "[");
  for (size_t d = 0; d < dims.size() && used < capacity; ++d)
    used += std::snprintf(buffer + used, capacity - used, d == 0 ? "%" PRId64 : ", %" PRId64,
                          static_cast<int64_t>(dims[d]));
  if (used < capacity) std::snprintf(buffer + used, capacity - used, "]");
}

// The same for an ExecuTorch tensor, in the engine's dtype names.
void describe(char* buffer, size_t capacity, const Tensor& t) {
  DType dtype;
  size_t used =
      to_engine_dtype(t.scalar_type(), &dtype)
          ? std::snprintf(buffer, capacity, "%s ", engine::dtype_name(dtype))
          : std::snprintf(buffer, capacity, "%s ", et::toString(t.scalar_type()));
  if (used < capacity) format_dims(buffer + used, capacity - used, t.sizes());
}

// True when `data` is memory the GPU can use in place. A tensor that the
// program tagged CUDA may still hold host memory when the caller fed a host
// tensor to a program exported for device I/O.
bool is_device_memory(const void* data) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace

bool to_engine_dtype(ScalarType type, DType* out) {
  switch (type) {
    case ScalarType::Float:
      *out = DType::kFloat32;
      return true;
    case ScalarType::Half:
      *out = DType::kFloat16;
      return true;
    case ScalarType::BFloat16:
      *out = DType::kBFloat16;
      return true;
    case ScalarType::Long:
      *out = DType::kInt64;
      return true;
    case ScalarType::Int:
      *out = DType::kInt32;
      return true;
    case ScalarType::Bool:
      *out = DType::kBool;
      return true;
    default:
      return false;
  }
}

// "float32 [8, 512]" for an engine tensor.
void describe(char* buffer, size_t capacity, const engine::TensorDesc& t) {
  size_t used = std::snprintf(buffer, capacity, "%s ", engine::dtype_name(t.dtype));
  if (used < capacity) format_dims(buffer + used, capacity - used, t.shape);
}

// Checks one delegate argument against the engine's input/output `index`.
Error check_tensor(const EValue* value, const engine::TensorDesc& want, const char* what,
                   size_t index, int engine_device) {
  if (value == nullptr || !value->isTensor()) {
    char tag[32] = "null";
    if (value != nullptr) et::tag_to_string(value->tag, tag, sizeof(tag));
    ET_LOG(Error, "KilnBackend: %s %zu: expected a tensor, got %s", what, index, tag);
    return Error::InvalidArgument;
  }
  const Tensor& t = value->toTensor();
  if (t.device_type() != executorch::aten::DeviceType::CPU) {
    if (t.device_type() != executorch::aten::DeviceType::CUDA) {
      ET_LOG(Error, "KilnBackend: %s %zu: the tensor is on device type %d; Kiln takes host "
             "(CPU) or CUDA tensors", what, index, static_cast<int>(t.device_type()));
      return Error::NotSupported;
    }
    if (static_cast<int>(t.device_index()) != engine_device) {
      ET_LOG(Error, "KilnBackend: %s %zu: the tensor is on CUDA device %d, but this engine "
             "was loaded on CUDA device %d", what, index, static_cast<int>(t.device_index()),
             engine_device);
      return Error::InvalidArgument;
    }
  }
  DType dtype;
  bool match = to_engine_dtype(t.scalar_type(), &dtype) && dtype == want.dtype &&
               static_cast<size_t>(t.dim()) == want.shape.size();
  for (size_t d = 0; match && d < want.shape.size(); ++d)
    match = static_cast<int64_t>(t.size(static_cast<ssize_t>(d))) == want.shape[d];
  if (!match) {
    char expected[192], got[192];
    describe(expected, sizeof(expected), want);
    describe(got, sizeof(got), t);
    ET_LOG(Error, "KilnBackend: %s %zu: expected %s, got %s", what, index, expected, got);
    return Error::InvalidArgument;
  }
  if (!et::is_contiguous_dim_order(t.dim_order().data(), t.dim())) {
    ET_LOG(Error, "KilnBackend: %s %zu: the tensor is not contiguous (non-default dim order)",
           what, index);
    return Error::InvalidArgument;
  }
  return Error::Ok;
}

// Fills `io` from a checked tensor argument. A CUDA-tagged tensor (a program
// exported for device-resident I/O) must hold device memory: host memory
// there means the caller gave a CPU tensor to a device-resident program,
// refused rather than staged, so that the mistake (and its hidden copies)
// is seen at once.
Error describe_io(const Tensor& t, bool is_input, size_t index, int engine_device,
                  runtime::IoBuffer* io) {
  io->data = is_input ? const_cast<void*>(t.const_data_ptr()) : t.mutable_data_ptr();
  io->nbytes = t.nbytes();
  io->on_device = t.device_type() == executorch::aten::DeviceType::CUDA;
  if (io->on_device && io->nbytes > 0 && !is_device_memory(io->data)) {
    ET_LOG(Error,
           "KilnBackend: %s %zu: expected CUDA device memory on device %d (the program was "
           "exported for device-resident inputs/outputs), got host memory (a CPU tensor?); "
           "give a CUDA tensor, or export without device-resident I/O",
           is_input ? "input" : "output", index, engine_device);
    return Error::InvalidArgument;
  }
  return Error::Ok;
}

// The shape variant whose sizes equal the inputs' dims. A size outside its
// dim's exported range, or one no variant was compiled for, is refused
// naming the input, the dim and what the program takes (execute() must not
// allocate: messages go through fixed buffers).
Error pick_variant(const engine::VariantSetDesc& shapes, et::Span<EValue*> args, size_t* pick) {
  int64_t size_of[64];  // per binding; the reader bounds bindings by the blob, checked here
  const size_t n = shapes.bindings.size();
  if (n > sizeof(size_of) / sizeof(size_of[0])) {
    ET_LOG(Error, "KilnBackend: the shape model has %zu input dims (at most 64)", n);
    return Error::NotSupported;
  }
  for (size_t b = 0; b < n; ++b) {
    const engine::VariantBinding& bind = shapes.bindings[b];
    const EValue* value = bind.input < args.size() ? args[bind.input] : nullptr;
    if (value == nullptr || !value->isTensor() || bind.dim >= static_cast<uint32_t>(value->toTensor().dim())) {
      ET_LOG(Error, "KilnBackend: input %u: expected a tensor with a dynamic dim %u", bind.input, bind.dim);
      return Error::InvalidArgument;
    }
    size_of[b] = static_cast<int64_t>(value->toTensor().size(static_cast<ssize_t>(bind.dim)));
  }
  for (size_t v = 0; v < shapes.values.size(); ++v) {
    bool match = true;
    for (size_t b = 0; match && b < n; ++b) match = size_of[b] == shapes.values[v][shapes.bindings[b].symbol];
    if (match) {
      *pick = v;
      return Error::Ok;
    }
  }
  for (size_t b = 0; b < n; ++b) {
    const engine::VariantBinding& bind = shapes.bindings[b];
    const engine::VariantSymbol& sym = shapes.symbols[bind.symbol];
    if (size_of[b] < sym.min || size_of[b] > sym.max) {
      ET_LOG(Error,
             "KilnBackend: input %u dim %u: size %" PRId64 " is outside the exported range [%" PRId64 ", %" PRId64
             "] of dynamic dim %s",
             bind.input, bind.dim, size_of[b], sym.min, sym.max, sym.name.c_str());
      return Error::InvalidArgument;
    }
  }
  // In range, but not a compiled size: name the sizes of each dim.
  for (size_t b = 0; b < n; ++b) {
    const engine::VariantBinding& bind = shapes.bindings[b];
    char sizes[256];
    size_t used = 0;
    sizes[0] = '\0';
    for (size_t v = 0; v < shapes.values.size() && used < sizeof(sizes); ++v) {
      const int64_t value = shapes.values[v][bind.symbol];
      bool seen = false;
      for (size_t u = 0; u < v && !seen; ++u) seen = shapes.values[u][bind.symbol] == value;
      if (!seen)
        used += std::snprintf(sizes + used, sizeof(sizes) - used, used == 0 ? "%" PRId64 : ", %" PRId64, value);
    }
    bool compiled = false;
    for (size_t v = 0; v < shapes.values.size() && !compiled; ++v)
      compiled = shapes.values[v][bind.symbol] == size_of[b];
    if (!compiled || b + 1 == n) {
      const engine::VariantSymbol& sym = shapes.symbols[bind.symbol];
      ET_LOG(Error,
             "KilnBackend: input %u dim %u: size %" PRId64 " was not compiled (dynamic dim %s in [%" PRId64
             ", %" PRId64 "] has engines for sizes %s%s; export with shape_buckets naming it, or feed "
             "one of those sizes)",
             bind.input, bind.dim, size_of[b], sym.name.c_str(), sym.min, sym.max, sizes,
             compiled ? " in other combinations with the other dims" : "");
      return Error::InvalidArgument;
    }
  }
  return Error::InvalidArgument;
}

}  // namespace kiln::delegate
