// ExecutionContext: creation, buffers, launch arguments and their rebinding,
// and run(). execute() (staging, graph replay) is in execution_context_io.cpp.
#include "runtime/execution_context.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/cuda_check.h"
#include "runtime/device.h"

namespace kiln::runtime {

using engine::KernelArgKind;
using engine::StepKind;
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
  graph_.reset();
  if (capture_stream_ != nullptr) (void)cudaStreamDestroy(capture_stream_);
  for (cublasLtMatmulDesc_t op : owned_ops_) (void)cublasLtMatmulDescDestroy(op);
  if (cudnn_ != nullptr) (void)cudnnDestroy(cudnn_);
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
  // Made here, not at the first run: cudnnCreate allocates, which a CUDA
  // graph capture must not see.
  if (engine_->has_convs()) KILN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&cudnn_));
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
      // Kernels only read weights; the launch API wants non-const pointers.
      return const_cast<uint8_t*>(static_cast<const uint8_t*>(engine_->weights())) + t.offset;
  }
  return nullptr;
}

Status ExecutionContext::prepare_steps() {
  const engine::EngineDesc& desc = engine_->desc();
  size_t total_args = 0;
  for (const auto& step : desc.steps)
    if (step.kind == StepKind::kKernel) total_args += step.kernel.args.size();
  // Sized once: the pointers below (and the bindings into them) must never move.
  arg_slots_.assign(total_args, ArgSlot{nullptr});
  arg_pointers_.assign(total_args, nullptr);
  kernel_calls_.assign(desc.steps.size(), KernelCall{});
  gemm_calls_.assign(desc.steps.size(), GemmCall{});
  conv_calls_.assign(desc.steps.size(), ConvCall{});

  // Records where `*slot` came from when it can move (not a weight).
  auto bind = [&](uint32_t tensor, void** slot, cublasLtMatmulDesc_t bias_op) {
    const TensorDesc& t = desc.tensors[tensor];
    Binding b;
    b.slot = slot;
    b.bias_op = bias_op;
    switch (t.storage) {
      case StorageKind::kWeight:
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
    bindings_.push_back(b);
  };

  size_t next_arg = 0;
  for (size_t i = 0; i < desc.steps.size(); ++i) {
    const engine::Step& step = desc.steps[i];
    if (step.kind == StepKind::kKernel) {
      const KernelPlan& plan = engine_->kernel_plan(i);
      KernelCall& call = kernel_calls_[i];
      call.func = reinterpret_cast<const void*>(plan.kernel);
      call.grid = plan.grid;
      call.block = plan.block;
      call.shared_bytes = plan.shared_bytes;
      call.args = step.kernel.args.empty() ? nullptr : &arg_pointers_[next_arg];
      for (const engine::KernelArg& arg : step.kernel.args) {
        ArgSlot& slot = arg_slots_[next_arg];
        switch (arg.kind) {
          case KernelArgKind::kTensor:
            slot.ptr = tensor_address(arg.tensor);
            bind(arg.tensor, &slot.ptr, nullptr);
            break;
          case KernelArgKind::kInt64:
            slot.i64 = arg.i64;
            break;
          case KernelArgKind::kFloat32:
            slot.f32 = arg.f32;
            break;
        }
        arg_pointers_[next_arg] = &slot;
        ++next_arg;
      }
    } else if (step.kind == StepKind::kConv) {
      const engine::ConvStep& c = step.conv;
      ConvCall& call = conv_calls_[i];
      call.plan = &engine_->conv_plan(i);
      // Bindings store void**; the read-only operands are kept as const void*.
      auto set = [&](uint32_t tensor, const void** slot) {
        if (tensor == engine::kNoTensor) return;
        *slot = tensor_address(tensor);
        bind(tensor, const_cast<void**>(slot), nullptr);
      };
      set(c.x, &call.ops.x);
      set(c.w, &call.ops.w);
      set(c.bias, &call.ops.bias);
      set(c.z, &call.ops.z);
      call.ops.out = tensor_address(c.out);
      bind(c.out, &call.ops.out, nullptr);
    } else {
      const engine::GemmStep& g = step.gemm;
      const GemmPlan& plan = engine_->gemm_plan(i);
      GemmCall& call = gemm_calls_[i];
      call.plan = &plan;
      call.op = plan.op;
      if (!plan.op_has_bias) {
        // The bias lives in this context's memory: give the step a descriptor
        // of its own that points at it.
        Result<cublasLtMatmulDesc_t> op = engine_->create_matmul_desc(i, tensor_address(g.bias));
        if (!op.is_ok()) return op.status().with_context(step_label(desc, i));
        owned_ops_.push_back(op.value());
        call.op = op.value();
        bind(g.bias, nullptr, call.op);
      }
      call.a = tensor_address(g.b);
      call.b = tensor_address(g.a);
      call.d = tensor_address(g.out);
      bind(g.b, &call.a, nullptr);
      bind(g.a, &call.b, nullptr);
      bind(g.out, &call.d, nullptr);
      // Without c, C aliases D and beta is 0, so C is never read.
      const uint32_t c = g.c != engine::kNoTensor ? g.c : g.out;
      call.c = tensor_address(c);
      bind(c, &call.c, nullptr);
    }
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
    if (b.slot != nullptr) {
      *b.slot = address;
    } else {
      KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          b.bias_op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &address, sizeof(address)));
    }
  }
  return Status::ok();
}

Status ExecutionContext::run_step(size_t step, cudaStream_t stream) {
  if (engine_->desc().steps[step].kind == StepKind::kKernel) {
    const KernelCall& call = kernel_calls_[step];
    KILN_CUDA_RETURN_IF_ERROR(cudaLaunchKernel(call.func, call.grid, call.block, call.args,
                                               call.shared_bytes, stream));
    KILN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
  }
  if (engine_->desc().steps[step].kind == StepKind::kConv) {
    if (!cudnn_stream_set_ || cudnn_stream_ != stream) {
      KILN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(cudnn_, stream));
      cudnn_stream_ = stream;
      cudnn_stream_set_ = true;
    }
    const ConvCall& call = conv_calls_[step];
    return enqueue_conv(cudnn_, *call.plan, call.ops, workspace_, call.plan->workspace_bytes);
  }
  const GemmCall& call = gemm_calls_[step];
  const GemmPlan& plan = *call.plan;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      engine_->cublas(), call.op, &plan.alpha, call.a, plan.layout_a, call.b, plan.layout_b,
      &plan.beta, call.c, plan.c_layout(), call.d, plan.layout_d, &plan.algo, workspace_,
      workspace_bytes_, stream));
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
  for (size_t i = 0; i < n; ++i) {
    if (profile) KILN_RETURN_IF_ERROR(profiler_.mark(i, stream));
    Status status = run_step(i, stream);
    if (!status.is_ok()) {
      if (profile) (void)profiler_.finish_run();  // releases the held stream
      return status.with_context(step_label(engine_->desc(), i));
    }
  }
  if (profile) {
    KILN_RETURN_IF_ERROR(profiler_.mark(n, stream));
    KILN_RETURN_IF_ERROR(profiler_.finish_run());
  }
  return Status::ok();
}

}  // namespace kiln::runtime
