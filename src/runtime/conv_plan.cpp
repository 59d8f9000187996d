#include "runtime/conv_plan.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "runtime/cuda_check.h"
#include "runtime/stream_timer.h"

namespace kiln::runtime {

using engine::DType;

namespace {

constexpr int kTimedAlgorithms = 4;  // best Find results whose call sequences are timed
constexpr int kTimedRuns = 3;

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;  // validated: float32
  }
}

// Never TF32 for float32 (CUDNN_DEFAULT_MATH would allow it on sm_80+).
cudnnMathType_t math_for(DType dtype) {
  return dtype == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

// Sets algo, fusion and math type on `plan` and sizes its workspace.
Status apply_choice(cudnnHandle_t handle, const ConvAlgoChoice& choice, size_t workspace_cap,
                    ConvPlan* plan) {
  if (choice.algo < 0 || choice.algo >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
    return make_status(StatusCode::kInvalidArgument, "algorithm %d out of range", choice.algo);
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo);
  // cuDNN's rule: the fused call without activation needs IMPLICIT_PRECOMP_GEMM.
  if (choice.fused && !plan->relu && algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
    return make_status(StatusCode::kInvalidArgument,
                       "fused identity convolution needs IMPLICIT_PRECOMP_GEMM, not algo %d",
                       choice.algo);
  plan->algo = algo;
  plan->fused = choice.fused;
  plan->math_type = math_for(plan->dtype);
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(plan->conv_desc, plan->math_type));
  size_t bytes = 0;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardWorkspaceSize(
      handle, plan->x_desc, plan->w_desc, plan->conv_desc, plan->y_desc, algo, &bytes));
  if (bytes > workspace_cap)
    return make_status(StatusCode::kUnsupported, "algo %d needs %zu workspace bytes (cap %zu)",
                       choice.algo, bytes, workspace_cap);
  plan->workspace_bytes = bytes;
  return Status::ok();
}

// One run of the plan's call sequence on the scratch operands, waited for.
Status trial_run(cudnnHandle_t handle, cudaStream_t stream, const ConvPlan& plan,
                 const ConvOperands& scratch, void* workspace) {
  KILN_RETURN_IF_ERROR(enqueue_conv(handle, plan, scratch, workspace, plan.workspace_bytes));
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status::ok();
}

// Mean milliseconds of the plan's call sequence; an error when cuDNN refuses it.
Result<float> time_choice(cudnnHandle_t handle, cudaStream_t stream, const ConvPlan& plan,
                          const ConvOperands& scratch, void* workspace) {
  KILN_RETURN_IF_ERROR(trial_run(handle, stream, plan, scratch, workspace));  // warm-up
  StreamTimer timer;
  return timer.time(stream, kTimedRuns, [&] {
    return enqueue_conv(handle, plan, scratch, workspace, plan.workspace_bytes);
  });
}

// The first Find results that ran, plus IMPLICIT_PRECOMP_GEMM wherever it
// ranked (the only algorithm the fused identity call accepts).
std::vector<int> candidate_algorithms(const cudnnConvolutionFwdAlgoPerf_t* perf, int count,
                                      size_t workspace_cap) {
  std::vector<int> algos;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > workspace_cap) continue;
    const int algo = static_cast<int>(perf[i].algo);
    if (std::find(algos.begin(), algos.end(), algo) != algos.end()) continue;
    if (static_cast<int>(algos.size()) < kTimedAlgorithms ||
        perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
      algos.push_back(algo);
  }
  return algos;
}

Status search(cudnnHandle_t handle, cudaStream_t stream, const ConvOperands& scratch,
              void* workspace, size_t workspace_cap, ConvPlan* plan, ConvAlgoChoice* best) {
  plan->math_type = math_for(plan->dtype);
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(plan->conv_desc, plan->math_type));
  int max_count = 0;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithmEx(
      handle, plan->x_desc, scratch.x, plan->w_desc, scratch.w, plan->conv_desc, plan->y_desc,
      scratch.out, static_cast<int>(perf.size()), &returned, perf.data(), workspace,
      workspace_cap));

  const bool something_to_fuse = plan->relu || plan->has_bias || plan->has_z;
  bool found = false;
  Status last_error = make_status(StatusCode::kUnsupported,
                                  "cudnnFindConvolutionForwardAlgorithmEx found no algorithm");
  for (int algo : candidate_algorithms(perf.data(), returned, workspace_cap)) {
    for (int fused = 0; fused <= 1; ++fused) {
      if (fused == 1 && !something_to_fuse) continue;
      if (fused == 1 && !plan->relu && algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        continue;
      ConvAlgoChoice choice;
      choice.algo = algo;
      choice.fused = fused == 1;
      choice.math_type = static_cast<int>(math_for(plan->dtype));
      Status status = apply_choice(handle, choice, workspace_cap, plan);
      Result<float> ms = status.is_ok()
                             ? time_choice(handle, stream, *plan, scratch, workspace)
                             : Result<float>(status);
      if (!ms.is_ok()) {
        // cuDNN refused this combination (e.g. NOT_SUPPORTED): try the next.
        (void)cudaGetLastError();
        last_error = ms.status().with_context("algo " + std::to_string(algo) +
                                              (choice.fused ? " fused" : " unfused"));
        continue;
      }
      choice.time_ms = ms.value();
      if (!found || choice.time_ms < best->time_ms) *best = choice;
      found = true;
    }
  }
  if (!found)
    return Status(StatusCode::kUnsupported,
                  "cuDNN has no working algorithm (last error: " + last_error.message() + ")");
  return apply_choice(handle, *best, workspace_cap, plan);
}

}  // namespace

Status create_conv_descriptors(const engine::ConvStep& s, DType dtype, bool z_is_out,
                               ConvPlan* plan) {
  const int64_t values[] = {s.n, s.h, s.w_in, s.c, s.k, s.r, s.s, s.p, s.q, s.pad_h, s.pad_w,
                            s.stride_h, s.stride_w, s.dilation_h, s.dilation_w, s.groups,
                            s.n * s.h * s.w_in * s.c, s.n * s.p * s.q * s.k, s.k * s.r * s.s * s.c};
  // The products cannot overflow: validate_engine checked the tensors' sizes.
  for (int64_t v : values)
    if (!fits_int(v))
      return make_status(StatusCode::kUnsupported,
                         "convolution extent %lld exceeds cuDNN's int range",
                         static_cast<long long>(v));
  plan->dtype = dtype;
  plan->relu = s.activation == engine::ConvActivation::kRelu;
  plan->has_bias = s.bias != engine::kNoTensor;
  plan->has_z = s.z != engine::kNoTensor;
  plan->z_is_out = plan->has_z && z_is_out;
  const cudnnDataType_t type = cudnn_type(dtype);
  const auto i = [](int64_t v) { return static_cast<int>(v); };

  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->x_desc));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(plan->x_desc, CUDNN_TENSOR_NHWC, type,
                                                        i(s.n), i(s.c), i(s.h), i(s.w_in)));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->y_desc));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(plan->y_desc, CUDNN_TENSOR_NHWC, type,
                                                        i(s.n), i(s.k), i(s.p), i(s.q)));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->bias_desc));
  KILN_CUDNN_RETURN_IF_ERROR(
      cudnnSetTensor4dDescriptor(plan->bias_desc, CUDNN_TENSOR_NHWC, type, 1, i(s.k), 1, 1));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&plan->w_desc));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(plan->w_desc, type, CUDNN_TENSOR_NHWC,
                                                        i(s.k), i(s.c / s.groups), i(s.r),
                                                        i(s.s)));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&plan->conv_desc));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
      plan->conv_desc, i(s.pad_h), i(s.pad_w), i(s.stride_h), i(s.stride_w), i(s.dilation_h),
      i(s.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionGroupCount(plan->conv_desc, i(s.groups)));
  plan->math_type = math_for(dtype);
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(plan->conv_desc, plan->math_type));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateActivationDescriptor(&plan->act_desc));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnSetActivationDescriptor(
      plan->act_desc, plan->relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
      CUDNN_PROPAGATE_NAN, 0.0));

  // cuDNN's own output shape must agree with the engine's (validated) one.
  int on = 0, ok = 0, op = 0, oq = 0;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolution2dForwardOutputDim(
      plan->conv_desc, plan->x_desc, plan->w_desc, &on, &ok, &op, &oq));
  if (on != s.n || ok != s.k || op != s.p || oq != s.q)
    return make_status(StatusCode::kInternal,
                       "cuDNN computes output [%d, %d, %d, %d] (NKPQ), the engine says "
                       "[%lld, %lld, %lld, %lld]",
                       on, ok, op, oq, static_cast<long long>(s.n), static_cast<long long>(s.k),
                       static_cast<long long>(s.p), static_cast<long long>(s.q));
  return Status::ok();
}

void destroy_conv_plan(ConvPlan* plan) {
  if (plan->x_desc != nullptr) (void)cudnnDestroyTensorDescriptor(plan->x_desc);
  if (plan->y_desc != nullptr) (void)cudnnDestroyTensorDescriptor(plan->y_desc);
  if (plan->bias_desc != nullptr) (void)cudnnDestroyTensorDescriptor(plan->bias_desc);
  if (plan->w_desc != nullptr) (void)cudnnDestroyFilterDescriptor(plan->w_desc);
  if (plan->conv_desc != nullptr) (void)cudnnDestroyConvolutionDescriptor(plan->conv_desc);
  if (plan->act_desc != nullptr) (void)cudnnDestroyActivationDescriptor(plan->act_desc);
  *plan = ConvPlan();
}

Status enqueue_conv(cudnnHandle_t handle, const ConvPlan& plan, const ConvOperands& ops,
                    void* workspace, size_t workspace_bytes) {
  const float one = 1.0f, zero = 0.0f;
  if (workspace_bytes == 0) workspace = nullptr;
  if (plan.fused) {
    // out = act(conv(x) + alpha2 * z + bias); z may alias out (cuDNN allows it).
    const float alpha2 = plan.has_z ? 1.0f : 0.0f;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBiasActivationForward(
        handle, &one, plan.x_desc, ops.x, plan.w_desc, ops.w, plan.conv_desc, plan.algo,
        workspace, workspace_bytes, &alpha2, plan.y_desc, plan.has_z ? ops.z : ops.out,
        plan.bias_desc, plan.has_bias ? ops.bias : plan.zero_bias, plan.act_desc, plan.y_desc,
        ops.out));
    return Status::ok();
  }
  // out = conv(x) (+ out when z is out's memory), then the rest in place.
  const float beta = plan.has_z && plan.z_is_out ? 1.0f : 0.0f;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
      handle, &one, plan.x_desc, ops.x, plan.w_desc, ops.w, plan.conv_desc, plan.algo, workspace,
      workspace_bytes, &beta, plan.y_desc, ops.out));
  if (plan.has_bias)
    KILN_CUDNN_RETURN_IF_ERROR(
        cudnnAddTensor(handle, &one, plan.bias_desc, ops.bias, &one, plan.y_desc, ops.out));
  if (plan.has_z && !plan.z_is_out)
    KILN_CUDNN_RETURN_IF_ERROR(
        cudnnAddTensor(handle, &one, plan.y_desc, ops.z, &one, plan.y_desc, ops.out));
  if (plan.relu)
    KILN_CUDNN_RETURN_IF_ERROR(cudnnActivationForward(handle, plan.act_desc, &one, plan.y_desc,
                                                      ops.out, &zero, plan.y_desc, ops.out));
  return Status::ok();
}

Status choose_conv_algorithm(cudnnHandle_t handle, cudaStream_t stream, const ConvSignature& sig,
                             const ConvOperands& scratch, void* workspace, size_t workspace_cap,
                             ConvAlgoCache& cache, ConvPlan* plan) {
  plan->key = conv_cache_key(sig);
  // A cached choice is trusted only after cuDNN accepted one run of it.
  auto try_cached = [&]() -> bool {
    ConvAlgoChoice choice;
    if (!cache.lookup(plan->key, &choice)) return false;
    Status status = apply_choice(handle, choice, workspace_cap, plan);
    if (status.is_ok()) status = trial_run(handle, stream, *plan, scratch, workspace);
    if (status.is_ok()) return true;
    (void)cudaGetLastError();
    cache.erase(plan->key);
    return false;
  };
  if (try_cached()) return Status::ok();
  std::lock_guard<std::mutex> lock(cache.search_mutex());
  if (try_cached()) return Status::ok();  // another thread searched meanwhile

  ConvAlgoChoice best;
  Status status = search(handle, stream, scratch, workspace, workspace_cap, plan, &best);
  if (!status.is_ok()) return status.with_context("choosing a cuDNN algorithm for " + plan->key);
  cache.insert(plan->key, best);
  return Status::ok();
}

}  // namespace kiln::runtime
