// Holds a stream until release(): work enqueued meanwhile then runs back to
// back, so event intervals around it measure GPU time, not the CPU's launch
// cost (which for a 10 us conv can exceed the conv). Used by load-time
// algorithm timing (stream_timer.h) and KILN_PROFILE_STEPS (step_profiler.h).
// Never on the execute path of a normal run.
//
// How: hold() launches a one-thread kernel that polls a flag in mapped
// (zero-copy) pinned host memory with a volatile load, sleeping ~1 us between
// polls (`nanosleep`), until release() writes the flag; the work enqueued
// after it waits in stream order. Nothing runs on the host while the stream
// is held: no CUDA host function blocks or spins (a blocked host function
// stalls CUDA's callback thread, and with it every stream's host functions in
// the process). The wait is bounded on the GPU (2 s by %globaltimer and at
// most 4M polls): if the holding thread blocks before release() — e.g. a
// library call that waits for the device, or lazy module loading that needs
// the context idle — the stream runs on after the bound instead of
// deadlocking, and that timing merely includes launch gaps. Why not
// cuStreamWaitValue32 (a driver-side wait, no SM used): it cannot be bounded,
// so the same mistake would hang the process. Cost: one block of one thread
// on one SM while held (asleep most of the time), a 4-byte flag in a page of
// pinned memory per gate, and the kernel (PTX, ~1 KiB) JIT-compiled once per
// process. Where the kernel cannot be loaded, hold() does nothing (the run is
// timed with launch gaps; logged once at debug level).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace kiln::runtime {

class StreamGate {
 public:
  StreamGate() = default;
  // Releases a stream still held and waits for it, then frees the flag.
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // Enqueues the wait on `stream` (releasing any earlier hold first). The
  // flag is allocated on the first call and reused.
  Status hold(cudaStream_t stream);
  // Lets the held stream run and waits until it has finished. No-op when
  // nothing is held.
  Status release_and_sync();
  // True between a hold() that enqueued the wait and release_and_sync().
  bool holding() const { return holding_; }

 private:
  uint32_t* flag_ = nullptr;       // mapped pinned host memory, written by release()
  void* flag_device_ = nullptr;    // the same flag as the GPU addresses it
  uint32_t generation_ = 0;        // the value release() writes; one more per hold
  cudaStream_t held_ = nullptr;
  bool holding_ = false;
};

}  // namespace kiln::runtime
