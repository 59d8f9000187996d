#include "runtime/cuda_graph.h"

#include "runtime/cuda_check.h"

namespace kiln::runtime {

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  (void)cudaGetLastError();
}

Status CudaGraph::record(cudaStream_t stream, EnqueueFn enqueue, void* user, bool* updated) {
  *updated = false;
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  Status status = enqueue(user, stream);
  cudaGraph_t graph = nullptr;
  // Always end the capture, also after a failed enqueue, or the stream stays
  // in capture mode and every later call on it fails.
  const cudaError_t end_error = cudaStreamEndCapture(stream, &graph);
  if (!status.is_ok()) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    reset();
    return status.with_context("recording a CUDA graph");
  }
  if (end_error != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    reset();
    return cuda_error_status(end_error, "cudaStreamEndCapture", __FILE__, __LINE__);
  }

  if (exec_ != nullptr) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess) {
      *updated = true;
      (void)cudaGraphDestroy(graph);
      return Status::ok();
    }
    (void)cudaGetLastError();  // refused: fall through to a fresh instantiation
    reset();
  }
  const cudaError_t error = cudaGraphInstantiate(&exec_, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  if (error != cudaSuccess) {
    exec_ = nullptr;
    return cuda_error_status(error, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return Status::ok();
}

Status CudaGraph::launch(cudaStream_t stream) {
  if (exec_ == nullptr)
    return make_status(StatusCode::kInternal, "CudaGraph::launch: nothing recorded");
  KILN_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return Status::ok();
}

}  // namespace kiln::runtime
