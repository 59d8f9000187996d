// Engine::plan_convs: cuDNN descriptors and algorithm choice for every conv
// step, at load. The search runs on scratch buffers that mimic the real
// operands' alignment (cuDNN kernels check it), on a private stream, and its
// results are cached process-wide (conv_algo_cache.h), so later engines and
// loads with the same layer shapes only pay one trial run per step.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/conv_algo_cache.h"
#include "runtime/conv_plan.h"
#include "runtime/cuda_check.h"
#include "runtime/engine.h"
#include "runtime/load_scratch.h"

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

}  // namespace

Status Engine::plan_convs() {
  size_t x_bytes = 0, w_bytes = 0, y_bytes = 0, bias_bytes = 0;
  for (const auto& step : desc_.steps) {
    if (step.kind != StepKind::kConv) continue;
    has_convs_ = true;
    const ConvStep& c = step.conv;
    x_bytes = std::max<size_t>(x_bytes, desc_.tensors[c.x].nbytes);
    w_bytes = std::max<size_t>(w_bytes, desc_.tensors[c.w].nbytes);
    y_bytes = std::max<size_t>(y_bytes, desc_.tensors[c.out].nbytes);
    // Every conv may be run fused, which needs a bias: zeros when it has none.
    bias_bytes = std::max<size_t>(bias_bytes, c.k * engine::dtype_size(desc_.tensors[c.x].dtype));
  }
  if (!has_convs_) return Status::ok();

  // Immutable zeros shared by every context.
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&zero_bias_, bias_bytes));
  KILN_CUDA_RETURN_IF_ERROR(cudaMemset(zero_bias_, 0, bias_bytes));

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
  for (size_t i = 0; i < desc_.steps.size(); ++i) {
    if (desc_.steps[i].kind != StepKind::kConv) continue;
    const ConvStep& c = desc_.steps[i].conv;
    const engine::DType dtype = desc_.tensors[c.x].dtype;
    const bool in_place = z_is_out(desc_, c);
    ConvPlan& plan = convs_[i];
    Status status = create_conv_descriptors(c, dtype, in_place, &plan);
    if (!status.is_ok()) return status.with_context(step_label(desc_, i));
    plan.zero_bias = zero_bias_;

    const auto align = [&](uint32_t t) {
      return t == engine::kNoTensor ? 256u : address_alignment(desc_.tensors[t]);
    };
    const ConvSignature sig =
        make_conv_signature(c, dtype, in_place, device_.sm, cudnn_version, align(c.x),
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
    if (!status.is_ok()) return status.with_context(step_label(desc_, i));
    workspace_bytes_ = std::max(workspace_bytes_, plan.workspace_bytes);
  }
  return Status::ok();
}

}  // namespace kiln::runtime
