// A loaded engine: everything about an EngineDesc that can be prepared once
// per GPU and then shared, read-only, by every ExecutionContext that runs it.
//
// Engine::load picks the machine code for this GPU, loads the generated
// kernels, uploads the weights once and plans every GEMM with cuBLASLt and
// every conv with cuDNN (algorithms timed at load, gemm_plan.h / conv_plan.h). After
// load nothing in an Engine changes, so several contexts (one per delegate
// handle, possibly on different threads) may use one Engine concurrently.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/conv_plan.h"
#include "runtime/device.h"
#include "runtime/gemm_plan.h"

namespace kiln::runtime {

// A kernel step resolved at load: the handle stays valid for the Engine's life.
struct KernelPlan {
  cudaKernel_t kernel = nullptr;
  dim3 grid;
  dim3 block;
  uint32_t shared_bytes = 0;  // dynamic shared memory
};

class Engine {
 public:
  // Loads `desc` onto CUDA device `device`, which is left current on the
  // calling thread. Fails with kIncompatible when a kernel module has no code
  // this GPU can run, kUnavailable without a GPU, kOutOfMemory, kUnsupported
  // for a GEMM cuBLASLt cannot do, kInternal for other CUDA failures.
  // The weights and kernel images are released from the stored desc once they
  // are on the GPU.
  static Result<std::unique_ptr<Engine>> load(engine::EngineDesc desc, int device);

  ~Engine();  // frees every GPU resource; errors are ignored
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The plan as loaded; `weights` and module images/PTX are empty here.
  const engine::EngineDesc& desc() const { return desc_; }
  const DeviceInfo& device_info() const { return device_; }
  int device() const { return device_.ordinal; }

  size_t num_inputs() const { return desc_.inputs.size(); }
  size_t num_outputs() const { return desc_.outputs.size(); }
  const engine::TensorDesc& input(size_t i) const { return desc_.tensors[desc_.inputs[i]]; }
  const engine::TensorDesc& output(size_t i) const { return desc_.tensors[desc_.outputs[i]]; }

  // Device base of the uploaded weights blob (nullptr when it is empty).
  const void* weights() const { return weights_; }
  size_t weights_bytes() const { return weights_bytes_; }
  // The largest workspace any planned GEMM or conv needs. Steps run one after
  // another on one stream, so a context allocates one buffer of this size.
  size_t workspace_bytes() const { return workspace_bytes_; }
  // nullptr when the engine has no GEMM step.
  cublasLtHandle_t cublas() const { return cublas_; }
  // True when a step runs through cuDNN (a context then makes a cuDNN handle).
  bool has_convs() const { return has_convs_; }

  // Valid for kernel / GEMM / conv steps respectively.
  const KernelPlan& kernel_plan(size_t step) const { return kernels_[step]; }
  const GemmPlan& gemm_plan(size_t step) const { return gemms_[step]; }
  const ConvPlan& conv_plan(size_t step) const { return convs_[step]; }

  // A matmul descriptor equal to gemm_plan(step).op but with `bias` as its
  // bias pointer. The caller owns it (cublasLtMatmulDescDestroy).
  Result<cublasLtMatmulDesc_t> create_matmul_desc(size_t step, const void* bias) const;

 private:
  Engine() = default;
  Status load_modules();
  Status resolve_kernels();
  Status upload_weights();
  Status plan_gemms();               // engine_gemm.cpp
  Status create_gemm_plan(size_t step);  // descriptors only
  Status plan_convs();  // engine_conv.cpp

  engine::EngineDesc desc_;
  DeviceInfo device_;
  std::vector<cudaLibrary_t> libraries_;  // one per module
  std::vector<KernelPlan> kernels_;       // per step
  std::vector<GemmPlan> gemms_;           // per step
  std::vector<ConvPlan> convs_;           // per step
  bool has_convs_ = false;
  void* zero_bias_ = nullptr;             // zeros for fused convs without a bias
  void* weights_ = nullptr;
  size_t weights_bytes_ = 0;
  size_t workspace_bytes_ = 0;
  cublasLtHandle_t cublas_ = nullptr;
};

// Byte alignment (<= 256) of a tensor's device address: engine inputs and
// outputs have buffers of their own, arena and weight tensors sit at
// `offset` from a 256-byte aligned base.
uint32_t address_alignment(const engine::TensorDesc& t);

// "step 3 ('addmm+gelu')", for messages.
std::string step_label(const engine::EngineDesc& desc, size_t step);

}  // namespace kiln::runtime
