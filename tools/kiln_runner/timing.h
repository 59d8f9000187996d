// kiln_runner's timing and its machine-readable report (--cuda_events,
// --timing_json): one timer per execute() call, latency statistics, GPU
// memory in use, KilnBackend's counters, and the JSON file the benchmark
// suite (benchmarks/run_benchmarks.py) reads.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace kiln::tools {

// Times one execute() call. Wall mode: std::chrono around the call (plus a
// device synchronize when outputs stay on the GPU, which the delegate does
// not wait for). Event mode: a CUDA event recorded before and after the call
// on the stream the Kiln delegate executes on from this thread (the
// kiln::CallerStreamGuard's stream if one is live, else cudaStreamPerThread;
// see src/delegate/kiln_backend.cpp pick_stream), then a wait on the second
// event, so each run is timed alone (a latency, not a pipelined throughput).
// Owns its two events; not copyable.
class RunTimer {
 public:
  explicit RunTimer(bool cuda_events) : cuda_events_(cuda_events) {}
  RunTimer(const RunTimer&) = delete;
  RunTimer& operator=(const RunTimer&) = delete;
  ~RunTimer();

  // Creates the events (event mode); "" or why not (no CUDA device).
  std::string init();
  // Call right before execute().
  void start();
  // Call right after execute(); waits for the GPU and returns milliseconds,
  // or a negative value when a CUDA call failed (`*error` says which).
  double stop(bool device_io, std::string* error);

 private:
  bool cuda_events_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::chrono::steady_clock::time_point wall_start_;
};

// Device memory in use on the current device (total - free from
// cudaMemGetInfo; creates the CUDA context first). false if no device.
bool device_memory_used(size_t* used_bytes);

// Linear-interpolated percentile of sorted values, p in [0, 1].
double percentile(const std::vector<double>& sorted, double p);

// KilnBackend's process-wide counters (get_option); zero when unavailable.
struct KilnCounters {
  bool available = false;
  int runs = 0, h2d = 0, d2h = 0, graph_launches = 0, graph_records = 0;
};
KilnCounters read_kiln_counters();
void print_kiln_counters(const KilnCounters& counters);

// What --timing_json writes.
struct TimingReport {
  std::string model_path;
  std::string method;
  std::string delegates;
  std::string timer;            // "cuda_events" or "wall"
  std::string use_cuda_graphs;  // "", "true", "false"
  bool device_io = false;
  long warmup = 0;
  std::vector<double> sorted_ms;  // timed runs, sorted
  double load_ms = 0.0;           // Module::load + load_method
  bool memory_known = false;
  size_t memory_before_load = 0;    // bytes in use before the program was loaded
  size_t memory_after_warmup = 0;   // bytes in use after the warm-up runs
  KilnCounters counters;
};

// Writes `report` as one JSON object to `path`; "" or why not.
std::string write_timing_json(const std::string& path, const TimingReport& report);

}  // namespace kiln::tools
