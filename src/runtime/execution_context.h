// The per-handle, mutable half of running an engine: device buffers for the
// arena and for each engine input/output, pinned staging buffers, the cuBLASLt
// workspace, and every launch's arguments resolved to this context's
// addresses. create() does all allocation; run() and execute_host() allocate
// nothing (error paths aside) and only enqueue work.
//
// Not thread-safe: one context serves one caller at a time (ExecuTorch runs a
// delegate handle from one thread at a time). Several contexts may share one
// Engine concurrently.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/engine.h"

namespace kiln::runtime {

class ExecutionContext {
 public:
  // Allocates everything a run needs on the engine's device (left current on
  // the calling thread). The context keeps `engine` alive.
  static Result<std::unique_ptr<ExecutionContext>> create(std::shared_ptr<const Engine> engine);

  ~ExecutionContext();  // frees every buffer; errors are ignored
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;

  // Enqueues every step on `stream`, reading the inputs from and writing the
  // outputs to this context's device buffers (input_buffer / output_buffer).
  // Does not synchronize; launch errors are returned, execution errors show
  // up at the next synchronization.
  Status run(cudaStream_t stream);

  // One synchronous call from host memory to host memory: copies each input
  // (input_nbytes[i] must equal the engine's size for input i) through pinned
  // staging to the GPU, runs, copies the outputs back and waits. The arrays
  // hold num_inputs() / num_outputs() entries.
  Status execute_host(const void* const* inputs, const size_t* input_nbytes,
                      void* const* outputs, const size_t* output_nbytes, cudaStream_t stream);

  const Engine& engine() const { return *engine_; }
  size_t num_inputs() const { return engine_->num_inputs(); }
  size_t num_outputs() const { return engine_->num_outputs(); }
  // dtype, shape and nbytes of each engine input/output, in argument order.
  const engine::TensorDesc& input_desc(size_t i) const { return engine_->input(i); }
  const engine::TensorDesc& output_desc(size_t i) const { return engine_->output(i); }
  // This context's device buffers (owned by the context).
  void* input_buffer(size_t i) const { return input_device_[i]; }
  void* output_buffer(size_t i) const { return output_device_[i]; }

 private:
  // One kernel parameter, passed by value from here.
  union ArgSlot {
    void* ptr;
    int64_t i64;
    float f32;
  };
  struct KernelCall {
    const void* func = nullptr;
    dim3 grid;
    dim3 block;
    uint32_t shared_bytes = 0;
    void** args = nullptr;  // into arg_pointers_
  };
  struct GemmCall {
    const GemmPlan* plan = nullptr;
    cublasLtMatmulDesc_t op = nullptr;  // the engine's, or one in owned_ops_
    const void* a = nullptr;            // cuBLASLt A (GemmStep::b)
    const void* b = nullptr;            // cuBLASLt B (GemmStep::a)
    const void* c = nullptr;
    void* d = nullptr;
  };

  explicit ExecutionContext(std::shared_ptr<const Engine> engine);
  Status allocate_buffers();
  Status prepare_steps();
  void* tensor_address(uint32_t tensor) const;
  Status run_step(size_t step, cudaStream_t stream);
  Status check_sizes(const void* const* data, const size_t* nbytes, bool inputs) const;

  std::shared_ptr<const Engine> engine_;
  void* arena_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<void*> input_device_;
  std::vector<void*> output_device_;
  std::vector<void*> input_pinned_;
  std::vector<void*> output_pinned_;
  std::vector<ArgSlot> arg_slots_;      // every kernel step's arguments, in order
  std::vector<void*> arg_pointers_;     // arg_pointers_[j] == &arg_slots_[j]
  std::vector<KernelCall> kernel_calls_;  // per step
  std::vector<GemmCall> gemm_calls_;      // per step
  std::vector<cublasLtMatmulDesc_t> owned_ops_;
};

}  // namespace kiln::runtime
