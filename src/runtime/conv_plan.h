// A conv step (engine::ConvStep) as cuDNN runs it: descriptors made once at
// Engine::load, the algorithm chosen at load (never at export) by timing on
// scratch buffers, and the call sequence run() enqueues.
//
// Two ways to run a step, chosen per shape by timing at load:
//   fused:   cudnnConvolutionBiasActivationForward (bias, z and ReLU in one
//            call). With no activation cuDNN only accepts it with
//            IMPLICIT_PRECOMP_GEMM; without a bias it reads the Engine's zero
//            bias buffer.
//   unfused: cudnnConvolutionForward (beta = 1 when z is out's own memory),
//            then cudnnAddTensor for the bias and for a separate z, then
//            cudnnActivationForward for ReLU, all in place on out.
// Math: float32 uses CUDNN_FMA_MATH so cuDNN never uses TF32 (results match
// PyTorch's fp32 conv to ~1e-5); float16/bfloat16 use CUDNN_TENSOR_OP_MATH.
// Every cuDNN call computes in fp32.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <string>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/conv_algo_cache.h"

namespace kiln::runtime {

// Upper bound for the workspace a conv algorithm may use (also bounded by a
// quarter of the GPU's free memory at load).
constexpr size_t kMaxConvWorkspaceBytes = 256u << 20;

// Owned by the Engine; destroy_conv_plan frees the descriptors.
struct ConvPlan {
  cudnnTensorDescriptor_t x_desc = nullptr;
  cudnnTensorDescriptor_t y_desc = nullptr;     // out, and z (same shape)
  cudnnTensorDescriptor_t bias_desc = nullptr;  // [1, k, 1, 1]
  cudnnFilterDescriptor_t w_desc = nullptr;     // KRSC
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  cudnnActivationDescriptor_t act_desc = nullptr;  // ReLU or identity
  engine::DType dtype = engine::DType::kFloat32;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  cudnnMathType_t math_type = CUDNN_FMA_MATH;
  bool fused = false;
  bool relu = false;
  bool has_bias = false;
  bool has_z = false;
  bool z_is_out = false;           // z is out's memory: accumulate in place
  size_t workspace_bytes = 0;      // for the chosen algorithm
  const void* zero_bias = nullptr; // Engine-owned zeros for a fused call without bias
  std::string key;                 // the algorithm cache key, for messages
};

// Device addresses of one conv step's operands (bias/z null when absent).
struct ConvOperands {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  const void* z = nullptr;
  void* out = nullptr;
};

// Makes the descriptors of validated `step`. kUnsupported when an extent
// does not fit cuDNN's int-based legacy API.
Status create_conv_descriptors(const engine::ConvStep& step, engine::DType dtype, bool z_is_out,
                               ConvPlan* plan);
void destroy_conv_plan(ConvPlan* plan);

// Enqueues the step on the stream `handle` is bound to. No allocation.
Status enqueue_conv(cudnnHandle_t handle, const ConvPlan& plan, const ConvOperands& ops,
                    void* workspace, size_t workspace_bytes);

// Picks plan->algo / fused / math_type / workspace_bytes: from `cache` when
// the signature was seen before (checked by one trial run), else by
// cudnnFindConvolutionForwardAlgorithmEx plus timing the fused and unfused
// call sequences of the best algorithms on `scratch` (which must be laid out
// like the real operands: same alignments, z == out when z_is_out). Always
// runs the chosen sequence at least once, so cuDNN's kernels are loaded
// before any CUDA graph capture. `handle` must be bound to `stream`.
Status choose_conv_algorithm(cudnnHandle_t handle, cudaStream_t stream, const ConvSignature& sig,
                             const ConvOperands& scratch, void* workspace, size_t workspace_cap,
                             ConvAlgoCache& cache, ConvPlan* plan);

}  // namespace kiln::runtime
