#include "runtime/step_profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "engine_format/step_format.h"
#include "runtime/cuda_check.h"

namespace kiln::runtime {
namespace {

// The kind's own one-line summary (engine_format/step_format.h).
std::string describe(const engine::EngineDesc& desc, size_t i) {
  const engine::Step& s = desc.steps[i];
  return engine::find_step_format(s.kind)->summary(desc, s) + " [" + s.label + "]";
}

}  // namespace

bool StepProfiler::requested() {
  const char* v = std::getenv("KILN_PROFILE_STEPS");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

Status StepProfiler::init(size_t steps) {
  events_.assign(steps + 1, nullptr);
  total_ms_.assign(steps, 0.0);
  for (cudaEvent_t& e : events_) KILN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  return Status::ok();
}

StepProfiler::~StepProfiler() {
  for (cudaEvent_t e : events_)
    if (e != nullptr) (void)cudaEventDestroy(e);
}

Status StepProfiler::hold(cudaStream_t stream) { return gate_.hold(stream); }

Status StepProfiler::mark(size_t boundary, cudaStream_t stream) {
  KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[boundary], stream));
  return Status::ok();
}

Status StepProfiler::finish_run() {
  KILN_RETURN_IF_ERROR(gate_.release_and_sync());
  for (size_t i = 0; i < total_ms_.size(); ++i) {
    float ms = 0.0f;
    KILN_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    total_ms_[i] += ms;
  }
  ++runs_;
  return Status::ok();
}

void StepProfiler::abandon_run() { (void)gate_.release_and_sync(); }

void StepProfiler::report(const engine::EngineDesc& desc) const {
  if (runs_ == 0) return;
  std::vector<size_t> order(total_ms_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return total_ms_[a] > total_ms_[b]; });
  const double sum = std::accumulate(total_ms_.begin(), total_ms_.end(), 0.0);
  std::fprintf(stderr, "kiln profile: %zu steps, %lld plain runs, %.4f ms per run in steps\n", order.size(),
               static_cast<long long>(runs_), sum / static_cast<double>(runs_));
  for (size_t i : order) {
    const double us = 1000.0 * total_ms_[i] / static_cast<double>(runs_);
    std::fprintf(stderr, "kiln profile: %8.2f us %5.1f%%  step %3zu %s\n", us,
                 sum > 0 ? 100.0 * total_ms_[i] / sum : 0.0, i + 1, describe(desc, i).c_str());
  }
}

}  // namespace kiln::runtime
