// Conv steps, run side (the format half is
// engine_format/steps/conv_step_format.cpp). At load: cuDNN descriptors and
// algorithm choice for every conv step; per context: one cuDNN handle (made at
// context creation: cudnnCreate allocates, which a CUDA graph capture must not
// see) and each step's operand pointers; run: the chosen call sequence.
//
// Algorithm choice at load. The search runs on scratch buffers that mimic the real
// operands' alignment (cuDNN kernels check it), on a private stream, and its
// results are cached process-wide (conv_algo_cache.h), so later engines and
// loads with the same layer shapes only pay one trial run per step.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/conv_algo_cache.h"
#include "runtime/conv_plan.h"
#include "runtime/cuda_check.h"
#include "runtime/engine.h"
#include "runtime/load_scratch.h"
#include "runtime/step_runtime.h"
#include "runtime/steps/conv_step_exec.h"

namespace kiln::runtime {

using engine::ConvStep;
using engine::StepKind;
using engine::StorageKind;
using engine::TensorDesc;

namespace {

// The search's cuDNN handle (bound to the scratch stream), destroyed on every
// path out of plan_convs before the stream.
struct SearchResources {
  LoadScratch scratch;
  cudnnHandle_t handle = nullptr;
  ~SearchResources() {
    if (handle != nullptr) (void)cudnnDestroy(handle);
  }
};

// z shares out's memory (validated: same tensor or identical arena range).
bool z_is_out(const engine::EngineDesc& desc, const ConvStep& c) {
  if (c.z == engine::kNoTensor) return false;
  if (c.z == c.out) return true;
  const TensorDesc& z = desc.tensors[c.z];
  const TensorDesc& o = desc.tensors[c.out];
  return z.storage == StorageKind::kArena && o.storage == StorageKind::kArena &&
         z.offset == o.offset;
}

// What load made for every conv step; owned by the Engine.
class ConvPlans : public StepKindPlans {
 public:
  ~ConvPlans() override {
    for (ConvPlan& p : plans) destroy_conv_plan(&p);
    if (zero_bias != nullptr) (void)cudaFree(zero_bias);
    (void)cudaGetLastError();
  }
  Result<std::unique_ptr<StepKindContext>> create_context(const Engine& engine) const override;

  std::vector<ConvPlan> plans;  // per step (conv steps only)
  void* zero_bias = nullptr;    // zeros for fused convs without a bias
};

// Per context: the cuDNN handle every conv step of the context uses (a handle
// must not be used by two threads at once), bound to the run's stream when it
// changes.
class ConvContext : public StepKindContext {
 public:
  ConvContext(const ConvPlans& plans, const Engine& engine) : plans_(plans), engine_(engine) {}
  ~ConvContext() override {
    if (handle_ != nullptr) (void)cudnnDestroy(handle_);
  }
  Status init() {
    KILN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&handle_));
    return Status::ok();
  }
  Result<std::unique_ptr<StepExecutor>> make_executor(size_t step, StepBinder& binder) override;

  // Hot path: no allocation.
  Status use_stream(cudaStream_t stream) {
    if (!stream_set_ || stream_ != stream) {
      KILN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(handle_, stream));
      stream_ = stream;
      stream_set_ = true;
    }
    return Status::ok();
  }
  cudnnHandle_t handle() const { return handle_; }

 private:
  const ConvPlans& plans_;
  const Engine& engine_;
  cudnnHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool stream_set_ = false;
};

class ConvExecutor : public StepExecutor {
 public:
  ConvExecutor(ConvContext& context, const ConvPlan& plan, void* workspace)
      : context_(context), plan_(plan), workspace_(workspace) {}

  Status run(cudaStream_t stream) override {
    KILN_RETURN_IF_ERROR(context_.use_stream(stream));
    return enqueue_conv(context_.handle(), plan_, ops, workspace_, plan_.workspace_bytes);
  }

  ConvOperands ops;  // the pointers are rebound like a GEMM's

 private:
  ConvContext& context_;
  const ConvPlan& plan_;
  void* workspace_;
};

Result<std::unique_ptr<StepExecutor>> ConvContext::make_executor(size_t step,
                                                                 StepBinder& binder) {
  const engine::ConvStep& c = engine_.desc().steps[step].conv;
  auto ex = std::make_unique<ConvExecutor>(*this, plans_.plans[step], binder.workspace());
  // Bindings store void**; the read-only operands are kept as const void*.
  auto set = [&](uint32_t tensor, const void** slot) {
    if (tensor == engine::kNoTensor) return;
    binder.bind(tensor, const_cast<void**>(slot));
  };
  set(c.x, &ex->ops.x);
  set(c.w, &ex->ops.w);
  set(c.bias, &ex->ops.bias);
  set(c.z, &ex->ops.z);
  binder.bind(c.out, &ex->ops.out);
  return std::unique_ptr<StepExecutor>(std::move(ex));
}

Result<std::unique_ptr<StepKindContext>> ConvPlans::create_context(const Engine& engine) const {
  auto context = std::make_unique<ConvContext>(*this, engine);
  KILN_RETURN_IF_ERROR(context->init());
  return std::unique_ptr<StepKindContext>(std::move(context));
}

// Every conv step's descriptors and algorithm.
Result<std::unique_ptr<StepKindPlans>> load(StepLoadEnv& env) {
  const engine::EngineDesc& desc = env.desc;
  const DeviceInfo& device = env.device;
  bool any_conv = false;
  size_t x_bytes = 0, w_bytes = 0, y_bytes = 0, bias_bytes = 0;
  for (const auto& step : desc.steps) {
    if (step.kind != StepKind::kConv) continue;
    any_conv = true;
    const ConvStep& c = step.conv;
    x_bytes = std::max<size_t>(x_bytes, desc.tensors[c.x].nbytes);
    w_bytes = std::max<size_t>(w_bytes, desc.tensors[c.w].nbytes);
    y_bytes = std::max<size_t>(y_bytes, desc.tensors[c.out].nbytes);
    // Every conv may be run fused, which needs a bias: zeros when it has none.
    bias_bytes = std::max<size_t>(bias_bytes, c.k * engine::dtype_size(desc.tensors[c.x].dtype));
  }
  if (!any_conv) return std::unique_ptr<StepKindPlans>();
  // On failure `plans` is destroyed, which frees what was made so far.
  auto plans = std::make_unique<ConvPlans>();
  plans->plans.resize(desc.steps.size());

  // Immutable zeros shared by every context.
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&plans->zero_bias, bias_bytes));
  KILN_CUDA_RETURN_IF_ERROR(cudaMemset(plans->zero_bias, 0, bias_bytes));

  SearchResources res;
  KILN_ASSIGN_OR_RETURN(cudaStream_t stream, res.scratch.stream());
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&res.handle));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(res.handle, stream));
  KILN_ASSIGN_OR_RETURN(const size_t workspace_cap,
                        LoadScratch::workspace_cap(kMaxConvWorkspaceBytes));
  KILN_ASSIGN_OR_RETURN(uint8_t* x_scratch, res.scratch.allocate(x_bytes));
  KILN_ASSIGN_OR_RETURN(uint8_t* w_scratch, res.scratch.allocate(w_bytes));
  KILN_ASSIGN_OR_RETURN(uint8_t* y_scratch, res.scratch.allocate(y_bytes));
  KILN_ASSIGN_OR_RETURN(uint8_t* z_scratch, res.scratch.allocate(y_bytes));
  KILN_ASSIGN_OR_RETURN(uint8_t* bias_scratch, res.scratch.allocate(bias_bytes));
  KILN_ASSIGN_OR_RETURN(uint8_t* workspace, res.scratch.allocate(workspace_cap));

  const int cudnn_version = static_cast<int>(cudnnGetVersion());
  ConvAlgoCache& cache = ConvAlgoCache::global();
  for (size_t i = 0; i < desc.steps.size(); ++i) {
    if (desc.steps[i].kind != StepKind::kConv) continue;
    const ConvStep& c = desc.steps[i].conv;
    const engine::DType dtype = desc.tensors[c.x].dtype;
    const bool in_place = z_is_out(desc, c);
    ConvPlan& plan = plans->plans[i];
    Status status = create_conv_descriptors(c, dtype, in_place, &plan);
    if (!status.is_ok()) return status.with_context(step_label(desc, i));
    plan.zero_bias = plans->zero_bias;

    const auto align = [&](uint32_t t) {
      return t == engine::kNoTensor ? 256u : address_alignment(desc.tensors[t]);
    };
    const ConvSignature sig =
        make_conv_signature(c, dtype, in_place, device.sm, cudnn_version, align(c.x),
                            align(c.w), align(c.bias), align(c.z), align(c.out));
    const auto aligned_like = LoadScratch::aligned_like;
    ConvOperands scratch;
    scratch.x = aligned_like(x_scratch, sig.align_x);
    scratch.w = aligned_like(w_scratch, sig.align_w);
    scratch.out = aligned_like(y_scratch, sig.align_out);
    scratch.bias = plan.has_bias ? aligned_like(bias_scratch, sig.align_bias) : nullptr;
    if (plan.has_z) scratch.z = in_place ? scratch.out : aligned_like(z_scratch, sig.align_z);

    status = choose_conv_algorithm(res.handle, stream, sig, scratch, workspace,
                                   workspace_cap, cache, &plan);
    if (!status.is_ok()) return status.with_context(step_label(desc, i));
    env.workspace_bytes = std::max(env.workspace_bytes, plan.workspace_bytes);
  }
  return std::unique_ptr<StepKindPlans>(std::move(plans));
}

}  // namespace

const ConvPlan* conv_step_plan(const Engine& engine, size_t step) {
  const auto* plans = static_cast<const ConvPlans*>(engine.step_plans(StepKind::kConv));
  if (plans == nullptr || step >= engine.desc().steps.size() ||
      engine.desc().steps[step].kind != StepKind::kConv)
    return nullptr;
  return &plans->plans[step];
}

extern const StepRuntime kConvStepRuntime = {StepKind::kConv, LoadStage::kAfterWeights, load};

}  // namespace kiln::runtime
