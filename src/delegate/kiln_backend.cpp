#include "delegate/kiln_backend.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cinttypes>
#include <functional>
#include <memory>
#include <string>
#include <mutex>
#include <new>
#include <utility>

#include <kiln/caller_stream.h>

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/runtime.h>

#include "delegate/backend_options.h"
#include "delegate/io_checks.h"
#include "delegate/status_to_error.h"
#include "engine_format/engine_format.h"
#include "engine_format/variant_set.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/engine.h"
#include "runtime/engine_cache.h"
#include "runtime/execution_context.h"
#include "runtime/shared_scratch.h"

namespace kiln::delegate {

namespace et = executorch::runtime;
using executorch::aten::Tensor;
using et::DelegateHandle;
using et::Error;
using et::EValue;

namespace {

// What init() hands ExecuTorch; placement-new'ed into the method's runtime
// allocator, so only its destructor runs in destroy().
// One engine and its execution state. A static partition has one; a
// dynamic one (engine_format/variant_set.h) one per shape variant.
struct Variant {
  std::unique_ptr<runtime::ExecutionContext> context;
  runtime::ContextStats reported;  // stats already added to the process counters
  bool graph_reason_logged = false;
  // The next alternative engine for the same shapes (variant_set.h), loaded at init: it runs the
  // calls whose stream this engine refuses (kIncompatible at execute, e.g. a persistent kernel
  // on a green context's few SMs).
  std::unique_ptr<Variant> fallback;
  bool fallback_logged = false;
};

struct KilnHandle {
  std::vector<Variant> variants;
  engine::VariantSetDesc shapes;  // no symbols for a static partition
};

// Process-wide settings (set_option) and counters (get_option).
struct ProcessState {
  std::mutex mutex;  // guards `options`
  ProcessOptions options;
  std::atomic<uint64_t> h2d_copies{0}, d2h_copies{0}, h2d_bytes{0}, d2h_bytes{0}, graph_launches{0}, graph_records{0},
      runs{0}, shared_engine_loads{0}, named_weight_uploads{0}, named_weight_reuses{0};
};

ProcessState& process_state() {
  // Leaked on purpose: handles may be destroyed during static teardown.
  static ProcessState* const state = new ProcessState();
  return *state;
}

ProcessOptions current_options() {
  ProcessState& state = process_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.options;
}

// Adds what `variant` did since the last call to the process counters.
void report_stats(Variant& variant) {
  const runtime::ContextStats& now = variant.context->stats();
  runtime::ContextStats& was = variant.reported;
  ProcessState& state = process_state();
  state.h2d_copies += now.h2d_copies - was.h2d_copies;
  state.d2h_copies += now.d2h_copies - was.d2h_copies;
  state.h2d_bytes += now.h2d_bytes - was.h2d_bytes;
  state.d2h_bytes += now.d2h_bytes - was.d2h_bytes;
  state.graph_launches += now.graph_launches - was.graph_launches;
  state.graph_records += now.graph_records - was.graph_records;
  state.runs += now.runs - was.runs;
  was = now;
}

// The stream this call runs on: the caller's (CallerStreamGuard on this
// thread) or cudaStreamPerThread. A caller stream of another device than the
// engine's is refused.
kiln::Status pick_stream(int engine_device, cudaStream_t* stream) {
  bool is_set = false;
  cudaStream_t caller = kiln::current_caller_stream(&is_set);
  if (!is_set) {
    *stream = cudaStreamPerThread;
    return kiln::Status::ok();
  }
  // The legacy and per-thread default streams belong to the current device,
  // which execute makes the engine's.
  if (caller != nullptr && caller != cudaStreamLegacy && caller != cudaStreamPerThread) {
    int stream_device = -1;
    const cudaError_t error = cudaStreamGetDevice(caller, &stream_device);
    if (error != cudaSuccess)
      return runtime::cuda_error_status(error, "cudaStreamGetDevice(caller stream)", __FILE__,
                                        __LINE__)
          .with_context("checking the stream set with kiln::CallerStreamGuard");
    if (stream_device != engine_device)
      return make_status(StatusCode::kInvalidArgument,
                         "the caller stream (kiln::CallerStreamGuard) is on CUDA device %d, but "
                         "this engine was loaded on CUDA device %d",
                         stream_device, engine_device);
  }
  *stream = caller;
  return kiln::Status::ok();
}

// The program's named data (ExecuTorch NamedDataMap: the .pte's own named
// data merged with a .ptd given at load) as the runtime's WeightSource.
class NamedDataSource : public runtime::WeightSource {
 public:
  explicit NamedDataSource(const et::NamedDataMap* map) : map_(map) {}
  kiln::Status read(const std::string& key,
                    const std::function<kiln::Status(const void*, size_t)>& use) const override {
    et::Result<et::FreeableBuffer> buffer = map_->get_data(key.c_str());
    if (!buffer.ok())
      return make_status(StatusCode::kInvalidArgument,
                         "named weight '%s' is not in the program's named data (ExecuTorch "
                         "error 0x%x); a .pte saved with external weights must be loaded with "
                         "its .ptd file (data_path), from the same export",
                         key.c_str(), static_cast<unsigned>(buffer.error()));
    kiln::Status status = use(buffer->data(), buffer->size());
    buffer->Free();
    return status;
  }

 private:
  const et::NamedDataMap* map_;  // the method's; outlives init
};

// Checked once: the answer does not change while the process runs.
const kiln::Status& gpu_status() {
  static const kiln::Status status = runtime::check_gpu_available();
  return status;
}

// Loads one engine (a static partition's, or one shape variant of a dynamic
// one) and creates its execution context; logs what was loaded.
kiln::Status load_variant(et::BackendInitContext& context, const engine::VariantEngine& blob,
                          const LoadOptions& load, const ProcessOptions& process, int device,
                          const char* method, Variant* out) {
  const bool share = load.use_shared_engines.value_or(process.use_shared_engines);
  runtime::EngineLoadStats load_stats;
  const et::NamedDataMap* named_data = context.get_named_data_map();
  NamedDataSource source(named_data);
  Result<std::shared_ptr<const runtime::Engine>> loaded = runtime::load_engine_shared(
      blob.data, blob.size, device, /*options_key=*/0, share,
      named_data != nullptr ? &source : nullptr, &load_stats, load.state_scope);
  if (!loaded.is_ok()) return loaded.status();
  std::shared_ptr<const runtime::Engine> shared = std::move(loaded).value();
  const size_t n_inputs = shared->num_inputs(), n_outputs = shared->num_outputs();
  if (n_inputs > kMaxEngineArgs || n_outputs > kMaxEngineArgs)
    return make_status(StatusCode::kUnsupported,
                       "the engine has %zu inputs and %zu outputs; the delegate takes at most %zu "
                       "of each",
                       n_inputs, n_outputs, kMaxEngineArgs);
  if (load_stats.shared) ++process_state().shared_engine_loads;
  process_state().named_weight_uploads += load_stats.named.uploaded;
  process_state().named_weight_reuses += load_stats.named.reused;

  runtime::ContextOptions context_options;
  GraphsSource graphs_source = GraphsSource::kProcessDefault;
  KILN_RETURN_IF_ERROR(resolve_use_cuda_graphs(load, shared->desc().find_metadata("use_cuda_graphs"),
                                               process.use_cuda_graphs, &context_options.use_cuda_graphs,
                                               &graphs_source));
  if (process.use_shared_activation_scratch)
    context_options.shared_scratch = runtime::SharedScratch::for_device(device);

  Result<std::unique_ptr<runtime::ExecutionContext>> exec =
      runtime::ExecutionContext::create(shared, std::move(context_options));
  if (!exec.is_ok()) return exec.status();
  out->context = std::move(exec).value();
  runtime::ExecutionContext& ctx = *out->context;

  const runtime::DeviceInfo& info = shared->device_info();
  const size_t named_count = shared->named_weights().size();
  if (named_count > 0)
    ET_LOG(Info,
           "KilnBackend: method '%s': named weights: %zu tensors, %" PRIu64 " bytes: %zu uploaded "
           "(%" PRIu64 " bytes), %zu already on GPU %d (%" PRIu64 " bytes)%s%s",
           method, named_count,
           shared->named_weights_bytes(), load_stats.named.uploaded,
           load_stats.named.uploaded_bytes,
           load_stats.shared ? named_count : load_stats.named.reused, info.ordinal,
           load_stats.shared ? shared->named_weights_bytes() : load_stats.named.reused_bytes,
           load_stats.shared ? ", with the whole engine of an earlier load" : "",
           load_stats.named.mismatches > 0
               ? "; a weight on the GPU had the same key but other bytes: loaded separately"
               : "");
  // Weights the engine made at load from the others (engine_desc.h DerivedWeight).
  const std::string derived_note =
      shared->derived_weights_bytes() > 0
          ? " + " + std::to_string(shared->derived_weights_bytes()) + " bytes made from them at load"
          : std::string();
  if (!shared->desc().states.empty())
    ET_LOG(Info, "KilnBackend: method '%s': %zu mutable state(s) (a KV cache) in state scope '%s'%s", method,
           shared->desc().states.size(), load.state_scope.c_str(),
           load.state_scope.empty() ? " (the default: shared by every load of this model on this GPU)" : "");
  ET_LOG(Info,
         "KilnBackend: loaded engine for method '%s': %zu steps, %zu inputs, %zu outputs, "
         "%zu bytes of weights (%s)%s, %zu-byte arena (%s), CUDA graphs %s (%s), on GPU %d "
         "(%s, sm_%d)",
         method, shared->desc().steps.size(), n_inputs, n_outputs,
         shared->weights_bytes() + static_cast<size_t>(shared->named_weights_bytes()),
         load_stats.shared ? "shared with an earlier load" : share ? "shareable" : "private",
         derived_note.c_str(),
         static_cast<size_t>(shared->desc().arena_bytes),
         ctx.uses_shared_scratch() ? "shared scratch" : "own",
         ctx.uses_cuda_graphs() ? "on" : "off", graphs_source_name(graphs_source), info.ordinal,
         info.name.c_str(), info.sm);
  if (!ctx.graph_disabled_reason().empty()) {
    out->graph_reason_logged = true;
    ET_LOG(Info, "KilnBackend: CUDA graph replay is off for this engine: %s",
           ctx.graph_disabled_reason().c_str());
  }
  return kiln::Status::ok();
}

// True when `a` and `b` take and give the same tensors (dtype and shape of each input and output).
bool same_io(const runtime::ExecutionContext& a, const runtime::ExecutionContext& b) {
  if (a.num_inputs() != b.num_inputs() || a.num_outputs() != b.num_outputs()) return false;
  for (size_t i = 0; i < a.num_inputs(); ++i)
    if (a.input_desc(i).dtype != b.input_desc(i).dtype || a.input_desc(i).shape != b.input_desc(i).shape) return false;
  for (size_t i = 0; i < a.num_outputs(); ++i)
    if (a.output_desc(i).dtype != b.output_desc(i).dtype || a.output_desc(i).shape != b.output_desc(i).shape)
      return false;
  return true;
}

// Loads alternatives [first, end) of one shape (variant_set.h) into *out: the first that can run
// on this GPU (one refused with kIncompatible gives way to the next, with a log line), and the
// ones after it as its fallback chain (one that cannot load is dropped, with a log line).
kiln::Status load_alternatives(et::BackendInitContext& context, const std::vector<engine::VariantEngine>& blobs,
                               size_t first, size_t end, const LoadOptions& load, const ProcessOptions& process,
                               int device, const char* method, Variant* out) {
  size_t at = first;
  for (;; ++at) {
    kiln::Status status = load_variant(context, blobs[at], load, process, device, method, out);
    if (status.is_ok()) break;
    if (status.code() != StatusCode::kIncompatible || at + 1 == end) {
      if (end - first > 1) status = status.with_context("engine alternative " + std::to_string(at - first));
      return status;
    }
    ET_LOG(Info, "KilnBackend: method '%s': engine alternative %zu cannot run on this GPU, loading the next: %s",
           method, at - first, status.message().c_str());
  }
  if (at + 1 < end) {
    auto fallback = std::make_unique<Variant>();
    kiln::Status status =
        load_alternatives(context, blobs, at + 1, end, load, process, device, method, fallback.get());
    if (status.is_ok() && !same_io(*out->context, *fallback->context))
      status = make_status(StatusCode::kCorruptData, "its inputs/outputs differ from the preferred engine's");
    if (status.is_ok()) {
      out->fallback = std::move(fallback);
      ET_LOG(Info, "KilnBackend: method '%s': fallback engine loaded too, for streams the preferred engine "
             "cannot run on", method);
    } else {
      ET_LOG(Error, "KilnBackend: method '%s': the fallback engine (alternative %zu) is left out: %s", method,
             at + 1 - first, status.to_string().c_str());
    }
  }
  return kiln::Status::ok();
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

  LoadOptions load;
  kiln::Status status = parse_load_options(context.runtime_specs(), &load);
  if (!status.is_ok()) return to_executorch_error(status, kPrefix);
  const ProcessOptions process = current_options();

  Result<int> device = runtime::current_device();
  if (!device.is_ok()) return to_executorch_error(device.status(), kPrefix);
  const char* method = context.get_method_name() != nullptr ? context.get_method_name() : "?";

  // One engine, or a dynamic partition's variant set (one engine per shape).
  engine::VariantSetDesc shapes;
  std::vector<engine::VariantEngine> blobs;
  if (engine::is_variant_set(*data, processed->size())) {
    status = engine::parse_variant_set(*data, processed->size(), &shapes, &blobs);
    if (!status.is_ok()) return to_executorch_error(status, kPrefix);
  } else {
    blobs.push_back({static_cast<const uint8_t*>(*data), processed->size()});
  }
  // Variants with equal values are alternatives (variant_set.h): one Variant per shape, the first
  // alternative that loads, with the rest as its fallback chain.
  std::vector<Variant> variants;
  std::vector<std::vector<int64_t>> values;
  if (shapes.values.empty()) shapes.values.assign(blobs.size(), {});
  for (size_t v = 0; v < blobs.size();) {
    size_t end = v + 1;
    while (end < blobs.size() && shapes.values[end] == shapes.values[v]) ++end;
    Variant chosen;
    status = load_alternatives(context, blobs, v, end, load, process, device.value(), method, &chosen);
    if (!status.is_ok()) {
      if (!shapes.symbols.empty()) status = status.with_context("shape variant " + std::to_string(v));
      return to_executorch_error(status, kPrefix);
    }
    variants.push_back(std::move(chosen));
    values.push_back(shapes.values[v]);
    v = end;
  }
  shapes.values = std::move(values);
  for (size_t v = 1; v < variants.size(); ++v)
    if (variants[v].context->num_inputs() != variants[0].context->num_inputs() ||
        variants[v].context->num_outputs() != variants[0].context->num_outputs())
      return to_executorch_error(make_status(StatusCode::kCorruptData,
                                             "shape variant %zu has other inputs/outputs than variant 0", v),
                                 kPrefix);
  for (const engine::VariantBinding& b : shapes.bindings)
    if (b.input >= variants[0].context->num_inputs())
      return to_executorch_error(make_status(StatusCode::kCorruptData,
                                             "the shape model names input %u of an engine with %zu inputs", b.input,
                                             variants[0].context->num_inputs()),
                                 kPrefix);
  if (!shapes.symbols.empty()) {
    std::string dims;
    for (size_t s = 0; s < shapes.symbols.size(); ++s)
      dims += (s ? "; " : "") + engine::describe_symbol(shapes, s);
    ET_LOG(Info, "KilnBackend: method '%s': dynamic shapes, %zu variants: %s", method, variants.size(),
           dims.c_str());
  }

  et::MemoryAllocator* allocator = context.get_runtime_allocator();
  void* memory = allocator != nullptr
                     ? allocator->allocate(sizeof(KilnHandle), alignof(KilnHandle))
                     : nullptr;
  if (memory == nullptr) {
    ET_LOG(Error, "%s: the runtime allocator has no room for the %zu-byte handle", kPrefix,
           sizeof(KilnHandle));
    return Error::MemoryAllocationFailed;  // `variants` frees the GPU side
  }
  auto* handle = new (memory) KilnHandle();
  handle->variants = std::move(variants);
  handle->shapes = std::move(shapes);
  processed->Free();  // everything needed now lives in the engine
  return static_cast<DelegateHandle*>(handle);
}

Error KilnBackend::execute(et::BackendExecutionContext& context, DelegateHandle* handle,
                           et::Span<EValue*> args) const {
  if (handle == nullptr) {
    ET_LOG(Error, "KilnBackend: execute called with a null handle");
    return Error::DelegateInvalidHandle;
  }
  KilnHandle& kiln_handle = *static_cast<KilnHandle*>(handle);
  size_t pick = 0;
  if (!kiln_handle.shapes.symbols.empty()) {
    Error error = pick_variant(kiln_handle.shapes, args, &pick);
    if (error != Error::Ok) return error;
  }
  Variant& variant = kiln_handle.variants[pick];
  runtime::ExecutionContext& exec = *variant.context;
  const size_t n_inputs = exec.num_inputs(), n_outputs = exec.num_outputs();
  if (args.size() != n_inputs + n_outputs) {
    ET_LOG(Error, "KilnBackend: expected %zu arguments (%zu inputs + %zu outputs), got %zu",
           n_inputs + n_outputs, n_inputs, n_outputs, args.size());
    return Error::InvalidArgument;
  }

  const int engine_device = exec.engine().device();
  cudaStream_t stream = nullptr;
  kiln::Status status = pick_stream(engine_device, &stream);
  if (!status.is_ok()) return to_executorch_error(status, "KilnBackend: execute failed");

  // Fixed-size arrays: no heap allocation per call (init() enforced the bound).
  runtime::IoBuffer inputs[kMaxEngineArgs];
  runtime::IoBuffer outputs[kMaxEngineArgs];
  for (size_t i = 0; i < n_inputs; ++i) {
    Error error = check_tensor(args[i], exec.input_desc(i), "input", i, engine_device);
    if (error != Error::Ok) return error;
    error = describe_io(args[i]->toTensor(), true, i, engine_device, &inputs[i]);
    if (error != Error::Ok) return error;
  }
  for (size_t i = 0; i < n_outputs; ++i) {
    EValue* value = args[n_inputs + i];
    if (!kiln_handle.shapes.symbols.empty() && value != nullptr && value->isTensor()) {
      // The variant's output sizes (ExecuTorch planned the outputs for the
      // largest).
      const std::vector<int64_t>& shape = exec.output_desc(i).shape;
      const Error resized =
          et::resize_tensor(value->toTensor(), executorch::aten::ArrayRef<int64_t>(shape.data(), shape.size()));
      if (resized != Error::Ok) {
        char want[192];
        describe(want, sizeof(want), exec.output_desc(i));
        ET_LOG(Error, "KilnBackend: output %zu: cannot resize it to the shape variant's %s (ExecuTorch error 0x%x)",
               i, want, static_cast<unsigned>(resized));
        return resized;
      }
    }
    Error error = check_tensor(value, exec.output_desc(i), "output", i, engine_device);
    if (error != Error::Ok) return error;
    error = describe_io(value->toTensor(), false, i, engine_device, &outputs[i]);
    if (error != Error::Ok) return error;
  }
  // An engine that refuses this stream (kIncompatible before anything was enqueued) hands the
  // call to its fallback, whose inputs and outputs are the same (checked at init).
  for (Variant* ran = &variant;; ran = ran->fallback.get()) {
    status = ran->context->execute(inputs, outputs, stream);
    report_stats(*ran);
    if (!ran->graph_reason_logged && !ran->context->graph_disabled_reason().empty()) {
      ran->graph_reason_logged = true;
      ET_LOG(Info, "KilnBackend: CUDA graph replay is off for this engine, running it normally: %s",
             ran->context->graph_disabled_reason().c_str());
    }
    if (status.code() != StatusCode::kIncompatible || ran->fallback == nullptr) break;
    if (!ran->fallback_logged) {
      ran->fallback_logged = true;
      ET_LOG(Info, "KilnBackend: running on the fallback engine: %s", status.message().c_str());
    }
  }
  if (!status.is_ok()) return to_executorch_error(status, "KilnBackend: execute failed");
  return Error::Ok;
}

void KilnBackend::destroy(DelegateHandle* handle) const {
  if (handle != nullptr) static_cast<KilnHandle*>(handle)->~KilnHandle();
}

Error KilnBackend::set_option(et::BackendOptionContext& context,
                              const et::Span<et::BackendOption>& backend_options) {
  ProcessState& state = process_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  ProcessOptions next;
  kiln::Status status = parse_set_options(
      et::Span<const et::BackendOption>(backend_options.data(), backend_options.size()),
      state.options, &next);
  if (!status.is_ok()) return to_executorch_error(status, "KilnBackend: set_option refused");
  state.options = next;
  return Error::Ok;
}

Error KilnBackend::get_option(et::BackendOptionContext& context,
                              et::Span<et::BackendOption>& backend_options) {
  ProcessState& state = process_state();
  CounterValues counters;
  counters.h2d_copies = state.h2d_copies;
  counters.d2h_copies = state.d2h_copies;
  counters.h2d_bytes = state.h2d_bytes;
  counters.d2h_bytes = state.d2h_bytes;
  counters.graph_launches = state.graph_launches;
  counters.graph_records = state.graph_records;
  counters.runs = state.runs;
  counters.shared_engine_loads = state.shared_engine_loads;
  counters.named_weight_uploads = state.named_weight_uploads;
  counters.named_weight_reuses = state.named_weight_reuses;
  kiln::Status status = fill_get_options(backend_options, current_options(), counters);
  if (!status.is_ok()) return to_executorch_error(status, "KilnBackend: get_option refused");
  return Error::Ok;
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
