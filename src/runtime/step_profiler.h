// Per-step GPU times of plain (non-graph) runs, for finding which kernels take
// an engine's time: KILN_PROFILE_STEPS=1 in the environment. Events are made
// when the context is created; a profiled run holds its stream (StreamGate: a
// GPU-side wait, bounded, no host function) until every step is enqueued, so the GPU then runs the steps back
// to back and each event interval is GPU time (as under graph replay), not
// the CPU's launch cost. The run then waits for its last event. The table (slowest steps first, with each step's
// label and summary) goes to stderr when the context is destroyed. Off (the
// default), it costs one branch per run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/stream_gate.h"

namespace kiln::runtime {

class StepProfiler {
 public:
  // Enabled when KILN_PROFILE_STEPS is set to something other than "0".
  static bool requested();

  Status init(size_t steps);  // creates steps + 1 events
  ~StepProfiler();

  bool active() const { return !events_.empty(); }
  // Before the first step: holds `stream` until finish_run() releases it.
  Status hold(cudaStream_t stream);
  // Around each step of a run on `stream` (never called while capturing).
  Status mark(size_t boundary, cudaStream_t stream);
  // After the last step: waits for the run and adds each step's time.
  Status finish_run();
  // On an error path: releases the held stream (and waits for it) without
  // counting the run.
  void abandon_run();
  void report(const engine::EngineDesc& desc) const;

 private:
  StreamGate gate_;
  std::vector<cudaEvent_t> events_;
  std::vector<double> total_ms_;
  int64_t runs_ = 0;
};

}  // namespace kiln::runtime
