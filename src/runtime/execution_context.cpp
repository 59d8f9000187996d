// ExecutionContext: creation, buffers, launch arguments and their rebinding,
// and run(). execute() (staging, graph replay) is in execution_context_io.cpp.
#include "runtime/execution_context.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/cuda_check.h"
#include "runtime/device.h"

namespace kiln::runtime {

using engine::StorageKind;
using engine::TensorDesc;

namespace {

// Kernels may assume the arena pointer is valid even when nothing is planned.
constexpr size_t kMinArenaBytes = 256;

// A zero-byte tensor still gets a (tiny) buffer so every address is non-null.
size_t buffer_bytes(uint64_t nbytes) { return std::max<uint64_t>(nbytes, 1); }

}  // namespace

ExecutionContext::ExecutionContext(std::shared_ptr<const Engine> engine, ContextOptions options)
    : engine_(std::move(engine)), scratch_(std::move(options.shared_scratch)) {
  graphs_enabled_ = options.use_cuda_graphs;
}

Result<std::unique_ptr<ExecutionContext>> ExecutionContext::create(
    std::shared_ptr<const Engine> engine, ContextOptions options) {
  if (engine == nullptr)
    return make_status(StatusCode::kInvalidArgument, "ExecutionContext::create: null engine");
  if (options.shared_scratch != nullptr && options.shared_scratch->device() != engine->device())
    return make_status(StatusCode::kInvalidArgument,
                       "ExecutionContext::create: shared scratch of device %d for an engine on "
                       "device %d",
                       options.shared_scratch->device(), engine->device());
  KILN_RETURN_IF_ERROR(ensure_current_device(engine->device()));
  std::unique_ptr<ExecutionContext> context(
      new ExecutionContext(std::move(engine), std::move(options)));
  // On failure `context` is destroyed, freeing whatever was allocated.
  KILN_RETURN_IF_ERROR(context->allocate_buffers());
  KILN_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&context->run_done_, cudaEventDisableTiming));
  KILN_RETURN_IF_ERROR(context->prepare_steps());
  if (StepProfiler::requested())
    KILN_RETURN_IF_ERROR(context->profiler_.init(context->engine_->desc().steps.size()));

  if (context->graphs_enabled_ && context->scratch_ != nullptr) {
    // The scratch may move under a recorded graph, and its lock must cover
    // the whole run anyway, so replay would buy nothing.
    context->graphs_enabled_ = false;
    context->graph_disabled_reason_ =
        "the context uses the shared activation scratch (use_shared_activation_scratch)";
  }
  if (context->graphs_enabled_) {
    const cudaError_t error =
        cudaStreamCreateWithFlags(&context->capture_stream_, cudaStreamNonBlocking);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      context->capture_stream_ = nullptr;
      context->graphs_enabled_ = false;
      context->graph_disabled_reason_ = std::string("cudaStreamCreateWithFlags failed: ") +
                                        cudaGetErrorString(error);
    }
  }
  return Result<std::unique_ptr<ExecutionContext>>(std::move(context));
}

ExecutionContext::~ExecutionContext() {
  profiler_.report(engine_->desc());
  // A run still in flight (device-only I/O) may use the buffers freed below.
  if (run_done_ != nullptr) {
    if (run_pending_) (void)cudaEventSynchronize(run_done_);
    (void)cudaEventDestroy(run_done_);
  }
  graph_.reset();
  if (capture_stream_ != nullptr) (void)cudaStreamDestroy(capture_stream_);
  executors_.clear();  // before the kind contexts they use
  kind_contexts_.clear();
  for (void* p : input_device_)
    if (p != nullptr) (void)cudaFree(p);
  for (void* p : output_device_)
    if (p != nullptr) (void)cudaFree(p);
  for (void* p : input_pinned_)
    if (p != nullptr) (void)cudaFreeHost(p);
  for (void* p : output_pinned_)
    if (p != nullptr) (void)cudaFreeHost(p);
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
  if (arena_ != nullptr) (void)cudaFree(arena_);
  (void)cudaGetLastError();
}

Status ExecutionContext::allocate_buffers() {
  const engine::EngineDesc& desc = engine_->desc();
  const size_t arena_bytes = std::max<uint64_t>(desc.arena_bytes, kMinArenaBytes);
  if (scratch_ != nullptr) {
    // Grow the shared buffer now, at load, so runs normally find it big enough.
    std::lock_guard<std::mutex> lock(scratch_->mutex());
    KILN_ASSIGN_OR_RETURN(bound_arena_, scratch_->acquire(arena_bytes));
  } else {
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&arena_, arena_bytes));
    device_bytes_ += arena_bytes;
    bound_arena_ = arena_;
  }
  // One workspace for GEMMs and convs: steps run one at a time on one stream.
  workspace_bytes_ = engine_->workspace_bytes();
  if (workspace_bytes_ > 0) {
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, workspace_bytes_));
    device_bytes_ += workspace_bytes_;
  }

  // Sized first (all null) so the destructor sees every slot if we stop halfway.
  input_device_.assign(num_inputs(), nullptr);
  input_pinned_.assign(num_inputs(), nullptr);
  output_device_.assign(num_outputs(), nullptr);
  output_pinned_.assign(num_outputs(), nullptr);
  for (size_t i = 0; i < num_inputs(); ++i) {
    const size_t bytes = buffer_bytes(input_desc(i).nbytes);
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&input_device_[i], bytes));
    KILN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&input_pinned_[i], bytes, cudaHostAllocDefault));
    device_bytes_ += bytes;
  }
  for (size_t i = 0; i < num_outputs(); ++i) {
    const size_t bytes = buffer_bytes(output_desc(i).nbytes);
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&output_device_[i], bytes));
    KILN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&output_pinned_[i], bytes, cudaHostAllocDefault));
    device_bytes_ += bytes;
  }
  bound_inputs_ = input_device_;
  bound_outputs_ = output_device_;
  // Sized here so execute() never allocates.
  graph_inputs_.assign(num_inputs(), nullptr);
  graph_outputs_.assign(num_outputs(), nullptr);
  graph_input_on_device_.assign(num_inputs(), 0);
  graph_output_on_device_.assign(num_outputs(), 0);
  host_io_.assign(num_inputs() + num_outputs(), IoBuffer{});
  return Status::ok();
}

void* ExecutionContext::tensor_address(uint32_t tensor) {
  const TensorDesc& t = engine_->desc().tensors[tensor];
  switch (t.storage) {
    case StorageKind::kInput:
      return bound_inputs_[t.io_index];
    case StorageKind::kOutput:
      return bound_outputs_[t.io_index];
    case StorageKind::kArena:
      return static_cast<uint8_t*>(bound_arena_) + t.offset;
    case StorageKind::kWeight:
    case StorageKind::kNamedWeight:
    case StorageKind::kDerivedWeight:
      // Kernels only read weights; the launch API wants non-const pointers.
      return const_cast<void*>(engine_->weight_address(t));
    case StorageKind::kState:
      return engine_->state_address(t);
  }
  return nullptr;
}

// The StepBinder the step kinds see: addresses in this context, recorded as
// Bindings when they can move (not weights).
class ExecutionContext::Binder : public StepBinder {
 public:
  explicit Binder(ExecutionContext& context) : context_(context) {}

  void* address(uint32_t tensor) override { return context_.tensor_address(tensor); }
  void bind(uint32_t tensor, void** slot) override {
    *slot = context_.tensor_address(tensor);
    Binding b;
    b.slot = slot;
    record(tensor, b);
  }
  void bind_with(uint32_t tensor, Status (*apply)(void*, void*), void* target) override {
    Binding b;
    b.apply = apply;
    b.target = target;
    record(tensor, b);
  }
  void* workspace() const override { return context_.workspace_; }
  size_t workspace_bytes() const override { return context_.workspace_bytes_; }

 private:
  void record(uint32_t tensor, Binding b) {
    const TensorDesc& t = context_.engine_->desc().tensors[tensor];
    switch (t.storage) {
      case StorageKind::kWeight:
      case StorageKind::kNamedWeight:
      case StorageKind::kDerivedWeight:
      case StorageKind::kState:  // fixed for the engine's life, like weights
        return;
      case StorageKind::kInput:
        b.base = Base::kInput;
        b.index = t.io_index;
        break;
      case StorageKind::kOutput:
        b.base = Base::kOutput;
        b.index = t.io_index;
        break;
      case StorageKind::kArena:
        b.base = Base::kArena;
        b.offset = t.offset;
        break;
    }
    context_.bindings_.push_back(b);
  }

  ExecutionContext& context_;
};

// Each step kind the engine uses makes its per-context state, then each step
// its executor (step_runtime.h); nothing here knows the kinds.
Status ExecutionContext::prepare_steps() {
  const engine::EngineDesc& desc = engine_->desc();
  for (const StepRuntime* kind : step_runtimes()) {
    const StepKindPlans* plans = engine_->step_plans(kind->kind);
    if (plans == nullptr) continue;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<StepKindContext> context,
                          plans->create_context(*engine_));
    const size_t id = static_cast<size_t>(kind->kind);
    if (kind_contexts_.size() <= id) kind_contexts_.resize(id + 1);
    kind_contexts_[id] = std::move(context);
  }
  Binder binder(*this);
  executors_.resize(desc.steps.size());
  for (size_t i = 0; i < desc.steps.size(); ++i) {
    const size_t id = static_cast<size_t>(desc.steps[i].kind);
    // Engine::load made plans for the kind of every step.
    StepKindContext* context = id < kind_contexts_.size() ? kind_contexts_[id].get() : nullptr;
    if (context == nullptr)
      return make_status(StatusCode::kInternal, "%s: no plans for its step kind %zu",
                         step_label(desc, i).c_str(), id);
    Result<std::unique_ptr<StepExecutor>> executor = context->make_executor(i, binder);
    if (!executor.is_ok()) return executor.status();
    executors_[i] = std::move(executor).value();
  }
  return Status::ok();
}

Status ExecutionContext::rebind(void* arena, const IoBuffer* inputs, const IoBuffer* outputs) {
  bool changed = arena != bound_arena_;
  bound_arena_ = arena;
  // A device tensor is used in place; a host one (or an empty one) goes
  // through this context's own buffer.
  for (size_t i = 0; i < num_inputs(); ++i) {
    void* want = inputs[i].on_device && inputs[i].data != nullptr ? inputs[i].data
                                                                  : input_device_[i];
    changed |= want != bound_inputs_[i];
    bound_inputs_[i] = want;
  }
  for (size_t i = 0; i < num_outputs(); ++i) {
    void* want = outputs[i].on_device && outputs[i].data != nullptr ? outputs[i].data
                                                                    : output_device_[i];
    changed |= want != bound_outputs_[i];
    bound_outputs_[i] = want;
  }
  if (!changed) return Status::ok();
  for (const Binding& b : bindings_) {
    uint8_t* base = nullptr;
    switch (b.base) {
      case Base::kInput:
        base = static_cast<uint8_t*>(bound_inputs_[b.index]);
        break;
      case Base::kOutput:
        base = static_cast<uint8_t*>(bound_outputs_[b.index]);
        break;
      case Base::kArena:
        base = static_cast<uint8_t*>(bound_arena_);
        break;
    }
    void* address = base + b.offset;
    if (b.slot != nullptr)
      *b.slot = address;
    else
      KILN_RETURN_IF_ERROR(b.apply(b.target, address));
  }
  return Status::ok();
}

Status ExecutionContext::run(cudaStream_t stream) {
  KILN_RETURN_IF_ERROR(ensure_current_device(engine_->device()));
  const size_t n = engine_->desc().steps.size();
  bool profile = false;
  if (profiler_.active()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    profile = capture == cudaStreamCaptureStatusNone;
    if (profile) KILN_RETURN_IF_ERROR(profiler_.hold(stream));
  }
  // Every path out of a profiled run releases the held stream.
  for (size_t i = 0; i < n; ++i) {
    if (profile) {
      Status marked = profiler_.mark(i, stream);
      if (!marked.is_ok()) {
        profiler_.abandon_run();
        return marked;
      }
    }
    Status status = executors_[i]->run(stream);
    if (!status.is_ok()) {
      if (profile) profiler_.abandon_run();
      return status.with_context(step_label(engine_->desc(), i));
    }
  }
  if (profile) {
    Status marked = profiler_.mark(n, stream);
    if (!marked.is_ok()) {
      profiler_.abandon_run();
      return marked;
    }
    KILN_RETURN_IF_ERROR(profiler_.finish_run());
  }
  return Status::ok();
}

}  // namespace kiln::runtime
