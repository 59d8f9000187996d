// The per-handle, mutable half of running an engine: device buffers for the
// arena and for each engine input/output, pinned staging buffers, the cuBLASLt
// workspace, and every launch's arguments resolved to this context's
// addresses. create() does all allocation; execute() allocates nothing
// (error paths, the first CUDA graph recording and a shared scratch that must
// grow aside) and only enqueues work.
//
// Not thread-safe: one context serves one caller at a time (ExecuTorch runs a
// delegate handle from one thread at a time). Several contexts may share one
// Engine concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/cuda_graph.h"
#include "runtime/engine.h"
#include "runtime/step_profiler.h"
#include "runtime/step_runtime.h"
#include "runtime/shared_scratch.h"

namespace kiln::runtime {

struct ContextOptions {
  // Record the launches (and the staging copies) once as a CUDA graph and
  // replay it. Ignored, with graph_disabled_reason() saying why, where the
  // context cannot replay (e.g. with a shared scratch).
  bool use_cuda_graphs = false;
  // Use this per-device buffer as the arena instead of one of our own.
  std::shared_ptr<SharedScratch> shared_scratch;
};

// One engine input or output as the caller holds it: host memory (staged
// through this context's pinned and device buffers) or device memory on the
// engine's device (used in place, no copy).
struct IoBuffer {
  void* data = nullptr;
  size_t nbytes = 0;
  bool on_device = false;
};

// Running totals for this context; read them between calls.
struct ContextStats {
  uint64_t runs = 0;
  uint64_t h2d_copies = 0;      // host input staged to the GPU
  uint64_t d2h_copies = 0;      // GPU output copied back to host
  uint64_t h2d_bytes = 0;       // bytes of those copies
  uint64_t d2h_bytes = 0;
  uint64_t graph_launches = 0;  // runs done by one cudaGraphLaunch
  uint64_t graph_records = 0;   // captures (first run, or I/O addresses changed)
  uint64_t graph_updates = 0;   // re-captures applied with cudaGraphExecUpdate
};

class ExecutionContext {
 public:
  // Allocates everything a run needs on the engine's device (left current on
  // the calling thread). The context keeps `engine` (and the scratch) alive.
  static Result<std::unique_ptr<ExecutionContext>> create(std::shared_ptr<const Engine> engine,
                                                          ContextOptions options = {});

  ~ExecutionContext();  // frees every buffer; errors are ignored
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;

  // Enqueues every step on `stream` over the currently bound buffers (this
  // context's own input/output buffers unless execute() bound others). Does
  // not synchronize and does not order itself after earlier runs on other
  // streams (execute() does); for a context with a shared scratch, call
  // execute().
  Status run(cudaStream_t stream);

  // One call: host inputs are copied through pinned staging, device inputs
  // are read in place; the engine runs (by graph replay when enabled); host
  // outputs are copied back. Waits for the stream when any input/output is
  // on the host or the scratch is shared (the buffers are reused by the next
  // call / the next context); with only device I/O it returns without
  // waiting and the outputs are ready when `stream` reaches this point.
  // Consecutive calls may use different streams: each run waits (on the GPU,
  // cudaStreamWaitEvent) for the previous run of this context, which used
  // the same arena, workspace and buffers.
  Status execute(const IoBuffer* inputs, const IoBuffer* outputs, cudaStream_t stream);

  // execute() with every input and output in host memory.
  Status execute_host(const void* const* inputs, const size_t* input_nbytes,
                      void* const* outputs, const size_t* output_nbytes, cudaStream_t stream);

  const Engine& engine() const { return *engine_; }
  size_t num_inputs() const { return engine_->num_inputs(); }
  size_t num_outputs() const { return engine_->num_outputs(); }
  // dtype, shape and nbytes of each engine input/output, in argument order.
  const engine::TensorDesc& input_desc(size_t i) const { return engine_->input(i); }
  const engine::TensorDesc& output_desc(size_t i) const { return engine_->output(i); }
  // This context's own device buffers (owned by the context).
  void* input_buffer(size_t i) const { return input_device_[i]; }
  void* output_buffer(size_t i) const { return output_device_[i]; }

  const ContextStats& stats() const { return stats_; }
  // True when runs replay a CUDA graph; else graph_disabled_reason() says why
  // (empty when graphs were not asked for).
  bool uses_cuda_graphs() const { return graphs_enabled_; }
  const std::string& graph_disabled_reason() const { return graph_disabled_reason_; }
  bool uses_shared_scratch() const { return scratch_ != nullptr; }
  // Device bytes this context allocated for itself (arena, workspace, I/O).
  size_t device_bytes() const { return device_bytes_; }

 private:
  class Binder;  // the StepBinder handed to the step kinds (execution_context.cpp)
  // An address that depends on where an input, output or the arena lives:
  // rebind() rewrites `*slot` (or calls apply(target, address)) when that moves.
  enum class Base : uint8_t { kInput, kOutput, kArena };
  struct Binding {
    Base base = Base::kArena;
    uint32_t index = 0;
    uint64_t offset = 0;
    void** slot = nullptr;  // an executor's pointer field
    Status (*apply)(void* target, void* address) = nullptr;  // else: this hook
    void* target = nullptr;
  };

  ExecutionContext(std::shared_ptr<const Engine> engine, ContextOptions options);
  Status allocate_buffers();
  Status prepare_steps();
  void* tensor_address(uint32_t tensor);  // records a Binding for movable tensors
  Status check_io(const IoBuffer* io, bool inputs) const;
  // Points every binding at `arena` and the given input/output addresses.
  Status rebind(void* arena, const IoBuffer* inputs, const IoBuffer* outputs);
  // The copies + steps of one run, enqueued on `stream` (also used to capture).
  Status enqueue(const IoBuffer* inputs, const IoBuffer* outputs, cudaStream_t stream);
  Status execute_locked(const IoBuffer* inputs, const IoBuffer* outputs, cudaStream_t stream);
  Status replay(const IoBuffer* inputs, const IoBuffer* outputs, cudaStream_t stream);
  bool graph_matches(const IoBuffer* inputs, const IoBuffer* outputs) const;

  std::shared_ptr<const Engine> engine_;
  std::shared_ptr<SharedScratch> scratch_;
  void* arena_ = nullptr;  // own arena; null with a shared scratch
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  size_t device_bytes_ = 0;
  std::vector<void*> input_device_;
  std::vector<void*> output_device_;
  std::vector<void*> input_pinned_;
  std::vector<void*> output_pinned_;
  // Step kinds (step_runtime.h): per-context state of each kind the engine
  // uses (indexed by StepKind id), then one executor per step. Destroyed
  // executors first.
  std::vector<std::unique_ptr<StepKindContext>> kind_contexts_;
  std::vector<std::unique_ptr<StepExecutor>> executors_;
  std::vector<Binding> bindings_;
  // Where the bindings point now (device addresses actually used by the steps).
  void* bound_arena_ = nullptr;
  std::vector<void*> bound_inputs_;
  std::vector<void*> bound_outputs_;

  // CUDA graph replay.
  bool graphs_enabled_ = false;
  std::string graph_disabled_reason_;
  cudaStream_t capture_stream_ = nullptr;  // private: the per-thread/legacy
                                           // streams cannot be captured
  CudaGraph graph_;
  // What the graph was recorded with: device addresses and host/device kind.
  std::vector<void*> graph_inputs_;
  std::vector<void*> graph_outputs_;
  std::vector<uint8_t> graph_input_on_device_;
  std::vector<uint8_t> graph_output_on_device_;
  std::vector<IoBuffer> host_io_;  // execute_host's arguments, sized once

  // Ordering of runs on different streams: recorded on the run's stream at
  // the end of every run that returns without waiting; the next run waits
  // for it on its own stream. Created at create() (no allocation per run).
  cudaEvent_t run_done_ = nullptr;
  bool run_pending_ = false;  // run_done_ marks a run the host has not waited for

  // The last stream every step kind accepted (StepKindContext::check_stream).
  cudaStream_t checked_stream_ = nullptr;
  bool stream_checked_ = false;

  ContextStats stats_;
  StepProfiler profiler_;  // KILN_PROFILE_STEPS=1 only
};

}  // namespace kiln::runtime
