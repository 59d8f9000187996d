// Holds a stream at a host function until release(): work enqueued meanwhile
// then runs back to back, so event intervals around it measure GPU time, not
// the CPU's launch cost (which for a 10 us conv can exceed the conv). Used by
// load-time algorithm timing (stream_timer.h) and KILN_PROFILE_STEPS
// (step_profiler.h). Never on the execute path of a normal run.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "common/status.h"

namespace kiln::runtime {

class StreamGate {
 public:
  StreamGate() = default;
  // Releases a stream still held and waits for it, so the host function
  // never reads a destroyed gate.
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // Enqueues the host function that waits for release() (at most 2 s, so an
  // error between hold and release cannot hang the stream).
  Status hold(cudaStream_t stream);
  // Lets the held stream run and waits until it has finished.
  Status release_and_sync();

 private:
  static void CUDART_CB wait_for_release(void* gate);

  std::atomic<int> gate_{1};
  cudaStream_t held_ = nullptr;
  bool holding_ = false;
};

}  // namespace kiln::runtime
