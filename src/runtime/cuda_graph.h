// A recorded run: stream capture of everything one run enqueues, turned into
// an executable CUDA graph that one cudaGraphLaunch replays. Owned by one
// ExecutionContext; not thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include "common/status.h"

namespace kiln::runtime {

class CudaGraph {
 public:
  // What record() calls to enqueue the work being captured.
  using EnqueueFn = Status (*)(void* user, cudaStream_t stream);

  CudaGraph() = default;
  ~CudaGraph();  // destroys the executable graph; errors ignored
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  bool ready() const { return exec_ != nullptr; }

  // Captures what `enqueue(user, stream)` enqueues on `stream`, which must be
  // a stream that can be captured (not the legacy or per-thread default
  // stream). Capture mode is thread-local: other threads may keep calling
  // CUDA (even cudaMalloc) meanwhile, but this thread must not make an
  // unsafe call between begin and end. With an executable graph already
  // there it is updated in place (cudaGraphExecUpdate, `*updated` = true);
  // when the update is refused (topology changed) it is re-instantiated.
  // On failure the capture is ended and discarded and ready() is false.
  Status record(cudaStream_t stream, EnqueueFn enqueue, void* user, bool* updated);

  // Replays the graph on `stream` (any stream of the graph's device,
  // including cudaStreamPerThread).
  Status launch(cudaStream_t stream);

  void reset();

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace kiln::runtime
