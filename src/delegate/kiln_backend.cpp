#include "delegate/kiln_backend.h"

#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdio>
#include <memory>
#include <new>
#include <utility>

#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/runtime.h>

#include "delegate/status_to_error.h"
#include "engine_format/engine_format.h"
#include "runtime/device.h"
#include "runtime/engine.h"
#include "runtime/execution_context.h"

namespace kiln::delegate {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using et::DelegateHandle;
using et::Error;
using et::EValue;
using kiln::engine::DType;

namespace {

// What init() hands ExecuTorch; placement-new'ed into the method's runtime
// allocator, so only its destructor runs in destroy().
struct KilnHandle {
  std::unique_ptr<runtime::ExecutionContext> context;
};

// Checked once: the answer does not change while the process runs.
const kiln::Status& gpu_status() {
  static const kiln::Status status = runtime::check_gpu_available();
  return status;
}

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

// Appends "[8, 512]" to `buffer` (a fixed buffer: execute() must not allocate).
template <typename Dims>
void format_dims(char* buffer, size_t capacity, const Dims& dims) {
  size_t used = std::snprintf(buffer, capacity, "[");
  for (size_t d = 0; d < dims.size() && used < capacity; ++d)
    used += std::snprintf(buffer + used, capacity - used, d == 0 ? "%" PRId64 : ", %" PRId64,
                          static_cast<int64_t>(dims[d]));
  if (used < capacity) std::snprintf(buffer + used, capacity - used, "]");
}

// "float32 [8, 512]" for an engine tensor.
void describe(char* buffer, size_t capacity, const engine::TensorDesc& t) {
  size_t used = std::snprintf(buffer, capacity, "%s ", engine::dtype_name(t.dtype));
  if (used < capacity) format_dims(buffer + used, capacity - used, t.shape);
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

// Checks one delegate argument against the engine's input/output `index`.
Error check_tensor(const EValue* value, const engine::TensorDesc& want, const char* what,
                   size_t index) {
  if (value == nullptr || !value->isTensor()) {
    char tag[32] = "null";
    if (value != nullptr) et::tag_to_string(value->tag, tag, sizeof(tag));
    ET_LOG(Error, "KilnBackend: %s %zu: expected a tensor, got %s", what, index, tag);
    return Error::InvalidArgument;
  }
  const Tensor& t = value->toTensor();
  if (t.device_type() != executorch::aten::DeviceType::CPU) {
    ET_LOG(Error,
           "KilnBackend: %s %zu: the tensor is in CUDA device memory; this Kiln delegate "
           "takes host (CPU) tensors only",
           what, index);
    return Error::NotSupported;
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

}  // namespace

bool KilnBackend::is_available() const { return gpu_status().is_ok(); }

et::Result<DelegateHandle*> KilnBackend::init(
    et::BackendInitContext& context, et::FreeableBuffer* processed,
    et::ArrayRef<et::CompileSpec> compile_specs) const {
  constexpr const char* kPrefix = "KilnBackend: cannot initialize";
  if (!gpu_status().is_ok()) return to_executorch_error(gpu_status(), kPrefix);
  if (processed == nullptr) {
    ET_LOG(Error, "%s: no delegate blob", kPrefix);
    return Error::InvalidProgram;
  }
  et::Result<const void*> data = processed->data_safe();
  if (!data.ok() || *data == nullptr) {
    ET_LOG(Error, "%s: the delegate blob has no data", kPrefix);
    return Error::InvalidProgram;
  }

  Result<engine::EngineDesc> desc = engine::parse_engine(*data, processed->size());
  if (!desc.is_ok()) return to_executorch_error(desc.status(), kPrefix);
  const size_t n_inputs = desc->inputs.size(), n_outputs = desc->outputs.size();
  if (n_inputs > kMaxEngineArgs || n_outputs > kMaxEngineArgs)
    return to_executorch_error(
        make_status(StatusCode::kUnsupported,
                    "the engine has %zu inputs and %zu outputs; the delegate takes at most %zu "
                    "of each",
                    n_inputs, n_outputs, kMaxEngineArgs),
        kPrefix);

  Result<int> device = runtime::current_device();
  if (!device.is_ok()) return to_executorch_error(device.status(), kPrefix);
  Result<std::unique_ptr<runtime::Engine>> engine =
      runtime::Engine::load(std::move(desc).value(), device.value());
  if (!engine.is_ok()) return to_executorch_error(engine.status(), kPrefix);
  std::shared_ptr<const runtime::Engine> shared(std::move(engine).value());

  Result<std::unique_ptr<runtime::ExecutionContext>> exec =
      runtime::ExecutionContext::create(shared);
  if (!exec.is_ok()) return to_executorch_error(exec.status(), kPrefix);

  et::MemoryAllocator* allocator = context.get_runtime_allocator();
  void* memory = allocator != nullptr
                     ? allocator->allocate(sizeof(KilnHandle), alignof(KilnHandle))
                     : nullptr;
  if (memory == nullptr) {
    ET_LOG(Error, "%s: the runtime allocator has no room for the %zu-byte handle", kPrefix,
           sizeof(KilnHandle));
    return Error::MemoryAllocationFailed;  // `exec` and `shared` free the GPU side
  }
  auto* handle = new (memory) KilnHandle{std::move(exec).value()};

  const runtime::DeviceInfo& info = shared->device_info();
  ET_LOG(Info,
         "KilnBackend: loaded engine for method '%s': %zu steps, %zu inputs, %zu outputs, "
         "%zu bytes of weights, %zu-byte arena, on GPU %d (%s, sm_%d)",
         context.get_method_name() != nullptr ? context.get_method_name() : "?",
         shared->desc().steps.size(), n_inputs, n_outputs, shared->weights_bytes(),
         static_cast<size_t>(shared->desc().arena_bytes), info.ordinal, info.name.c_str(),
         info.sm);
  processed->Free();  // everything needed now lives in the engine
  return static_cast<DelegateHandle*>(handle);
}

Error KilnBackend::execute(et::BackendExecutionContext& context, DelegateHandle* handle,
                           et::Span<EValue*> args) const {
  if (handle == nullptr) {
    ET_LOG(Error, "KilnBackend: execute called with a null handle");
    return Error::DelegateInvalidHandle;
  }
  runtime::ExecutionContext& exec = *static_cast<KilnHandle*>(handle)->context;
  const size_t n_inputs = exec.num_inputs(), n_outputs = exec.num_outputs();
  if (args.size() != n_inputs + n_outputs) {
    ET_LOG(Error, "KilnBackend: expected %zu arguments (%zu inputs + %zu outputs), got %zu",
           n_inputs + n_outputs, n_inputs, n_outputs, args.size());
    return Error::InvalidArgument;
  }

  // Fixed-size arrays: no heap allocation per call (init() enforced the bound).
  const void* input_data[kMaxEngineArgs];
  size_t input_bytes[kMaxEngineArgs];
  void* output_data[kMaxEngineArgs];
  size_t output_bytes[kMaxEngineArgs];
  for (size_t i = 0; i < n_inputs; ++i) {
    Error error = check_tensor(args[i], exec.input_desc(i), "input", i);
    if (error != Error::Ok) return error;
    const Tensor& t = args[i]->toTensor();
    input_data[i] = t.const_data_ptr();
    input_bytes[i] = t.nbytes();
  }
  for (size_t i = 0; i < n_outputs; ++i) {
    EValue* value = args[n_inputs + i];
    Error error = check_tensor(value, exec.output_desc(i), "output", i);
    if (error != Error::Ok) return error;
    const Tensor& t = value->toTensor();
    output_data[i] = t.mutable_data_ptr();
    output_bytes[i] = t.nbytes();
  }
  kiln::Status status =
      exec.execute_host(input_data, input_bytes, output_data, output_bytes, cudaStreamPerThread);
  if (!status.is_ok()) return to_executorch_error(status, "KilnBackend: execute failed");
  return Error::Ok;
}

void KilnBackend::destroy(DelegateHandle* handle) const {
  if (handle != nullptr) static_cast<KilnHandle*>(handle)->~KilnHandle();
}

KilnBackend& kiln_backend() {
  // Leaked on purpose: ExecuTorch keeps the pointer for the whole process.
  static KilnBackend* const backend = new KilnBackend();
  return *backend;
}

namespace {

// Registration at load time of the shared library.
const bool kRegistered = [] {
  Error error = et::register_backend(et::Backend{kBackendName, &kiln_backend()});
  if (error != Error::Ok) {
    // Logging may run before the program initialized ExecuTorch's PAL.
    et::runtime_init();
    ET_LOG(Error, "KilnBackend: register_backend failed: %s (0x%x)", et::to_string(error),
           static_cast<unsigned>(error));
    return false;
  }
  return true;
}();

}  // namespace

}  // namespace kiln::delegate
