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

ExecutionContext::ExecutionContext(std::shared_ptr<const Engine> engine)
    : engine_(std::move(engine)) {}

Result<std::unique_ptr<ExecutionContext>> ExecutionContext::create(
    std::shared_ptr<const Engine> engine) {
  if (engine == nullptr)
    return make_status(StatusCode::kInvalidArgument, "ExecutionContext::create: null engine");
  KILN_RETURN_IF_ERROR(ensure_current_device(engine->device()));
  std::unique_ptr<ExecutionContext> context(new ExecutionContext(std::move(engine)));
  // On failure `context` is destroyed, freeing whatever was allocated.
  KILN_RETURN_IF_ERROR(context->allocate_buffers());
  KILN_RETURN_IF_ERROR(context->prepare_steps());
  return Result<std::unique_ptr<ExecutionContext>>(std::move(context));
}

ExecutionContext::~ExecutionContext() {
  for (cublasLtMatmulDesc_t op : owned_ops_) (void)cublasLtMatmulDescDestroy(op);
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
  KILN_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&arena_, std::max<uint64_t>(desc.arena_bytes, kMinArenaBytes)));
  workspace_bytes_ = engine_->workspace_bytes();
  if (workspace_bytes_ > 0) KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, workspace_bytes_));

  // Sized first (all null) so the destructor sees every slot if we stop halfway.
  input_device_.assign(num_inputs(), nullptr);
  input_pinned_.assign(num_inputs(), nullptr);
  output_device_.assign(num_outputs(), nullptr);
  output_pinned_.assign(num_outputs(), nullptr);
  for (size_t i = 0; i < num_inputs(); ++i) {
    const size_t bytes = buffer_bytes(input_desc(i).nbytes);
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&input_device_[i], bytes));
    KILN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&input_pinned_[i], bytes, cudaHostAllocDefault));
  }
  for (size_t i = 0; i < num_outputs(); ++i) {
    const size_t bytes = buffer_bytes(output_desc(i).nbytes);
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&output_device_[i], bytes));
    KILN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&output_pinned_[i], bytes, cudaHostAllocDefault));
  }
  return Status::ok();
}

void* ExecutionContext::tensor_address(uint32_t tensor) const {
  const TensorDesc& t = engine_->desc().tensors[tensor];
  switch (t.storage) {
    case StorageKind::kInput:
      return input_device_[t.io_index];
    case StorageKind::kOutput:
      return output_device_[t.io_index];
    case StorageKind::kArena:
      return static_cast<uint8_t*>(arena_) + t.offset;
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
  // Sized once: the pointers below must never move.
  arg_slots_.assign(total_args, ArgSlot{nullptr});
  arg_pointers_.assign(total_args, nullptr);
  kernel_calls_.assign(desc.steps.size(), KernelCall{});
  gemm_calls_.assign(desc.steps.size(), GemmCall{});

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
      }
      call.a = tensor_address(g.b);
      call.b = tensor_address(g.a);
      call.d = tensor_address(g.out);
      // Without c, C aliases D and beta is 0, so C is never read.
      call.c = g.c != engine::kNoTensor ? tensor_address(g.c) : call.d;
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
  const GemmCall& call = gemm_calls_[step];
  const GemmPlan& plan = *call.plan;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      engine_->cublas(), call.op, &plan.alpha, call.a, plan.layout_a, call.b, plan.layout_b,
      &plan.beta, call.c, plan.layout_d, call.d, plan.layout_d, &plan.algo, workspace_,
      workspace_bytes_, stream));
  return Status::ok();
}

Status ExecutionContext::run(cudaStream_t stream) {
  KILN_RETURN_IF_ERROR(ensure_current_device(engine_->device()));
  const size_t n = engine_->desc().steps.size();
  for (size_t i = 0; i < n; ++i) {
    Status status = run_step(i, stream);
    if (!status.is_ok()) return status.with_context(step_label(engine_->desc(), i));
  }
  return Status::ok();
}

Status ExecutionContext::check_sizes(const void* const* data, const size_t* nbytes,
                                     bool inputs) const {
  const char* what = inputs ? "input" : "output";
  const size_t count = inputs ? num_inputs() : num_outputs();
  if (count > 0 && (data == nullptr || nbytes == nullptr))
    return make_status(StatusCode::kInvalidArgument, "execute_host: null %s arrays", what);
  for (size_t i = 0; i < count; ++i) {
    const TensorDesc& t = inputs ? input_desc(i) : output_desc(i);
    if (nbytes[i] != t.nbytes)
      return make_status(StatusCode::kInvalidArgument,
                         "%s %zu ('%s'): expected %llu bytes, got %zu", what, i, t.name.c_str(),
                         static_cast<unsigned long long>(t.nbytes), nbytes[i]);
    if (t.nbytes > 0 && data[i] == nullptr)
      return make_status(StatusCode::kInvalidArgument, "%s %zu ('%s'): null data pointer", what,
                         i, t.name.c_str());
  }
  return Status::ok();
}

Status ExecutionContext::execute_host(const void* const* inputs, const size_t* input_nbytes,
                                      void* const* outputs, const size_t* output_nbytes,
                                      cudaStream_t stream) {
  KILN_RETURN_IF_ERROR(check_sizes(inputs, input_nbytes, true));
  KILN_RETURN_IF_ERROR(check_sizes(outputs, output_nbytes, false));
  KILN_RETURN_IF_ERROR(ensure_current_device(engine_->device()));

  // Everything enqueued below reads or writes the pinned buffers; on a failure
  // wait for what was already enqueued so the next call cannot race with it.
  auto enqueue = [&]() -> Status {
    for (size_t i = 0; i < num_inputs(); ++i) {
      const size_t n = input_nbytes[i];
      if (n == 0) continue;
      std::memcpy(input_pinned_[i], inputs[i], n);
      KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(input_device_[i], input_pinned_[i], n,
                                                cudaMemcpyHostToDevice, stream));
    }
    KILN_RETURN_IF_ERROR(run(stream));
    for (size_t i = 0; i < num_outputs(); ++i) {
      const size_t n = output_nbytes[i];
      if (n == 0) continue;
      KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(output_pinned_[i], output_device_[i], n,
                                                cudaMemcpyDeviceToHost, stream));
    }
    return Status::ok();
  };
  Status status = enqueue();
  if (!status.is_ok()) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    return status;
  }
  // Kernel faults surface here.
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < num_outputs(); ++i)
    if (output_nbytes[i] > 0) std::memcpy(outputs[i], output_pinned_[i], output_nbytes[i]);
  return Status::ok();
}

}  // namespace kiln::runtime
