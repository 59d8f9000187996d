// Caller-chosen CUDA streams for Kiln delegates.
//
//   {
//     kiln::CallerStreamGuard guard(my_stream);
//     module.execute("forward", inputs);   // every Kiln delegate runs on my_stream
//   }
//
// The state lives in ONE shared library (libkiln_caller_stream.so) so every
// Kiln delegate loaded in the process sees the same guard. It is per thread:
// a guard affects executions started on the thread that created it. Guards
// nest; destroying one restores the stream that was current before it.
// Without a guard, delegates use cudaStreamPerThread.
//
// The guard does not own the stream: the caller keeps it alive for the
// guard's lifetime. A stream created on another device than the delegate's is
// refused at execute time with an error naming both devices.
#pragma once

#include <cuda_runtime_api.h>

#define KILN_CALLER_STREAM_API __attribute__((visibility("default")))

namespace kiln {

class KILN_CALLER_STREAM_API CallerStreamGuard {
 public:
  explicit CallerStreamGuard(cudaStream_t stream);
  ~CallerStreamGuard();
  CallerStreamGuard(const CallerStreamGuard&) = delete;
  CallerStreamGuard& operator=(const CallerStreamGuard&) = delete;

 private:
  cudaStream_t previous_;
  bool previous_set_;
};

// The stream of the innermost live guard on this thread; `*is_set` tells
// whether any guard is live (a guard may legitimately hold stream 0).
KILN_CALLER_STREAM_API cudaStream_t current_caller_stream(bool* is_set);

}  // namespace kiln
