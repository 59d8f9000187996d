#include "timing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <executorch/runtime/backend/interface.h>

#include "kiln/caller_stream.h"

namespace kiln::tools {
namespace {

namespace et = executorch::runtime;

std::string cuda_problem(const char* what, cudaError_t error) {
  return std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) +
         ")";
}

// JSON string literal for `text` (quotes, backslashes and control bytes escaped).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

RunTimer::~RunTimer() {
  if (start_ != nullptr) (void)cudaEventDestroy(start_);
  if (stop_ != nullptr) (void)cudaEventDestroy(stop_);
}

std::string RunTimer::init() {
  if (!cuda_events_) return "";
  if (cudaError_t e = cudaEventCreate(&start_); e != cudaSuccess)
    return cuda_problem("cudaEventCreate", e);
  if (cudaError_t e = cudaEventCreate(&stop_); e != cudaSuccess)
    return cuda_problem("cudaEventCreate", e);
  // The delegate's stream: the same rule as KilnBackend's pick_stream.
  bool is_set = false;
  const cudaStream_t caller = kiln::current_caller_stream(&is_set);
  stream_ = is_set ? caller : cudaStreamPerThread;
  return "";
}

void RunTimer::start() {
  if (cuda_events_)
    (void)cudaEventRecord(start_, stream_);
  else
    wall_start_ = std::chrono::steady_clock::now();
}

double RunTimer::stop(bool device_io, std::string* error) {
  if (!cuda_events_) {
    // With device-resident outputs the delegate does not wait for the GPU.
    if (device_io) (void)cudaDeviceSynchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                     wall_start_)
        .count();
  }
  if (cudaError_t e = cudaEventRecord(stop_, stream_); e != cudaSuccess) {
    *error = cuda_problem("cudaEventRecord", e);
    return -1.0;
  }
  if (cudaError_t e = cudaEventSynchronize(stop_); e != cudaSuccess) {
    *error = cuda_problem("cudaEventSynchronize", e);
    return -1.0;
  }
  float ms = 0.0f;
  if (cudaError_t e = cudaEventElapsedTime(&ms, start_, stop_); e != cudaSuccess) {
    *error = cuda_problem("cudaEventElapsedTime", e);
    return -1.0;
  }
  return ms;
}

bool device_memory_used(size_t* used_bytes) {
  if (cudaFree(nullptr) != cudaSuccess) return false;  // creates the context
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return false;
  *used_bytes = total_bytes - free_bytes;
  return true;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double position = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(position));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = position - static_cast<double>(lo);
  return sorted[lo] * (1.0 - frac) + sorted[hi] * frac;
}

KilnCounters read_kiln_counters() {
  KilnCounters c;
  et::BackendOptions<5> query;
  (void)query.set_option("runs", 0);
  (void)query.set_option("h2d_copies", 0);
  (void)query.set_option("d2h_copies", 0);
  (void)query.set_option("graph_launches", 0);
  (void)query.set_option("graph_records", 0);
  if (et::get_option("KilnBackend", query.view()) != et::Error::Ok) return c;
  c.available = true;
  (void)query.get_option("runs", c.runs);
  (void)query.get_option("h2d_copies", c.h2d);
  (void)query.get_option("d2h_copies", c.d2h);
  (void)query.get_option("graph_launches", c.graph_launches);
  (void)query.get_option("graph_records", c.graph_records);
  return c;
}

void print_kiln_counters(const KilnCounters& c) {
  if (!c.available) return;
  std::printf("KilnBackend counters: %d engine runs, %d host-to-device copies, %d "
              "device-to-host copies, %d CUDA graph launches, %d graph recordings\n",
              c.runs, c.h2d, c.d2h, c.graph_launches, c.graph_records);
}

std::string write_timing_json(const std::string& path, const TimingReport& r) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "cannot write --timing_json file '" + path + "'";
  const std::vector<double>& s = r.sorted_ms;
  const double mean = s.empty() ? 0.0 : std::accumulate(s.begin(), s.end(), 0.0) / s.size();
  std::fprintf(f, "{\n  \"model_path\": %s,\n  \"method\": %s,\n  \"delegates\": %s,\n",
               json_string(r.model_path).c_str(), json_string(r.method).c_str(),
               json_string(r.delegates).c_str());
  std::fprintf(f, "  \"timer\": %s,\n  \"use_cuda_graphs\": %s,\n  \"device_io\": %s,\n",
               json_string(r.timer).c_str(),
               r.use_cuda_graphs.empty() ? "null" : r.use_cuda_graphs.c_str(),
               r.device_io ? "true" : "false");
  std::fprintf(f, "  \"warmup\": %ld,\n  \"num_runs\": %zu,\n", r.warmup, s.size());
  std::fprintf(f, "  \"median_ms\": %.6f,\n  \"p10_ms\": %.6f,\n  \"p90_ms\": %.6f,\n",
               percentile(s, 0.5), percentile(s, 0.1), percentile(s, 0.9));
  std::fprintf(f, "  \"mean_ms\": %.6f,\n  \"min_ms\": %.6f,\n  \"max_ms\": %.6f,\n", mean,
               s.empty() ? 0.0 : s.front(), s.empty() ? 0.0 : s.back());
  std::fprintf(f, "  \"load_ms\": %.3f,\n", r.load_ms);
  if (r.memory_known)
    std::fprintf(f, "  \"gpu_memory_before_load_bytes\": %zu,\n"
                 "  \"gpu_memory_after_warmup_bytes\": %zu,\n  \"gpu_memory_used_bytes\": %lld,\n",
                 r.memory_before_load, r.memory_after_warmup,
                 static_cast<long long>(r.memory_after_warmup) -
                     static_cast<long long>(r.memory_before_load));
  else
    std::fprintf(f, "  \"gpu_memory_used_bytes\": null,\n");
  const KilnCounters& c = r.counters;
  std::fprintf(f, "  \"counters\": {\"runs\": %d, \"h2d_copies\": %d, \"d2h_copies\": %d, "
               "\"graph_launches\": %d, \"graph_records\": %d}\n}\n",
               c.runs, c.h2d, c.d2h, c.graph_launches, c.graph_records);
  const bool ok = std::fclose(f) == 0;
  return ok ? "" : "error writing --timing_json file '" + path + "'";
}

}  // namespace kiln::tools
