// Timing of enqueued work with CUDA events, for load-time algorithm searches
// (conv_plan.cpp, gemm_plan.cpp). Never used on the execute path. The stream
// is held while the runs are enqueued (stream_gate.h), so the time is the
// GPU's: CUDA graph replay runs steps back to back, and a choice timed with
// launch gaps in it once picked slower convolutions.
#pragma once

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "runtime/cuda_check.h"
#include "runtime/stream_gate.h"

namespace kiln::runtime {

// Two events and a gate (its pinned flag), created on first use and destroyed
// with the object (on every path out of a search). Not thread-safe; one per
// search.
class StreamTimer {
 public:
  StreamTimer() = default;
  ~StreamTimer() {
    if (start_ != nullptr) (void)cudaEventDestroy(start_);
    if (stop_ != nullptr) (void)cudaEventDestroy(stop_);
  }
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  // Mean milliseconds of `runs` calls of `enqueue` (a callable returning
  // Status that enqueues work on `stream`), waited for. An error from
  // `enqueue` or from the stream comes back as is.
  template <typename Enqueue>
  Result<float> time(cudaStream_t stream, int runs, Enqueue&& enqueue) {
    if (start_ == nullptr) KILN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
    if (stop_ == nullptr) KILN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    // Released, and the stream waited for, on every path out.
    struct ReleaseOnExit {
      StreamGate& gate;
      ~ReleaseOnExit() { (void)gate.release_and_sync(); }
    } release{gate_};
    KILN_RETURN_IF_ERROR(gate_.hold(stream));
    KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream));
    for (int i = 0; i < runs; ++i) KILN_RETURN_IF_ERROR(enqueue());
    KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream));
    KILN_RETURN_IF_ERROR(gate_.release_and_sync());
    float ms = 0.0f;
    KILN_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return ms / static_cast<float>(runs);
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  StreamGate gate_;  // declared last: destroyed (released) before the events
};

}  // namespace kiln::runtime
