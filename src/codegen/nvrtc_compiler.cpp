#include "codegen/nvrtc_compiler.h"

#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "ir/graph.h"

namespace kiln::codegen {
namespace {

using Clock = std::chrono::steady_clock;

void check(nvrtcResult result, const char* what) {
  if (result != NVRTC_SUCCESS) throw CompileError(std::string(what) + ": " + nvrtcGetErrorString(result));
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    nvrtcDestroyProgram(p);
    delete p;
  }
};
using Program = std::unique_ptr<nvrtcProgram, ProgramDeleter>;

Program compile(const std::string& name, const std::string& source, const std::string& arch) {
  Program program(new nvrtcProgram(nullptr));
  check(nvrtcCreateProgram(program.get(), source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  std::string arch_flag = "--gpu-architecture=" + arch;
  // No fast-math: results must match PyTorch's to float32 rounding.
  const char* options[] = {arch_flag.c_str(), "--std=c++17", "-default-device"};
  nvrtcResult result = nvrtcCompileProgram(*program, 3, options);
  if (result != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(*program, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nvrtcGetProgramLog(*program, log.data());
    throw CompileError("NVRTC failed to compile module '" + name + "' for " + arch + ": " +
                       nvrtcGetErrorString(result) + "\n" + log);
  }
  return program;
}

// The PTX of a compiled program; empty when NVRTC kept none.
std::string program_ptx(const Program& program) {
  size_t size = 0;
  if (nvrtcGetPTXSize(*program, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string ptx(size, '\0');
  check(nvrtcGetPTX(*program, ptx.data()), "nvrtcGetPTX");
  while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
  return ptx;
}

// What one sm_XX compile yields: its cubin and the PTX NVRTC made on the way.
struct Artifact {
  std::vector<uint8_t> cubin;
  std::string ptx;
};
using ArtifactPtr = std::shared_ptr<const Artifact>;

// Results by (arch, module name, source); the whole key is kept, so two
// sources never share an entry. Bounded by size, oldest dropped first.
class Cache {
 public:
  static constexpr uint64_t kMaxBytes = uint64_t(256) << 20;  // a few large models

  ArtifactPtr find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    ++stats_.hits;
    return it->second;
  }
  void put(const std::string& key, ArtifactPtr artifact) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.compiles;
    if (!entries_.emplace(key, artifact).second) return;
    order_.push_back(key);
    stats_.bytes += cost(key, *artifact);
    while (stats_.bytes > kMaxBytes && order_.size() > 1) {
      auto old = entries_.find(order_.front());
      stats_.bytes -= cost(old->first, *old->second);
      entries_.erase(old);
      order_.pop_front();
    }
    stats_.entries = entries_.size();
  }
  void count_compile() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.compiles;
  }
  NvrtcCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
    order_.clear();
    stats_ = {};
  }

 private:
  static uint64_t cost(const std::string& key, const Artifact& a) { return key.size() + a.cubin.size() + a.ptx.size(); }
  std::mutex mutex_;
  std::map<std::string, ArtifactPtr> entries_;
  std::deque<std::string> order_;
  NvrtcCacheStats stats_;
};

Cache& cache() {
  static Cache instance;
  return instance;
}

std::string cache_key(const std::string& arch, const std::string& name, const std::string& source) {
  std::string key = arch;
  key += '\0';
  key += name;
  key += '\0';
  key += source;
  return key;
}

ArtifactPtr compile_sm(const std::string& name, const std::string& source, uint32_t sm) {
  const std::string arch = "sm_" + std::to_string(sm);
  const std::string key = cache_key(arch, name, source);
  if (ArtifactPtr hit = cache().find(key)) return hit;
  Program program = compile(name, source, arch);
  auto artifact = std::make_shared<Artifact>();
  size_t size = 0;
  check(nvrtcGetCUBINSize(*program, &size), "nvrtcGetCUBINSize");
  artifact->cubin.resize(size);
  check(nvrtcGetCUBIN(*program, reinterpret_cast<char*>(artifact->cubin.data())), "nvrtcGetCUBIN");
  artifact->ptx = program_ptx(program);
  cache().put(key, artifact);
  return artifact;
}

// Worker threads for the SMs: KILN_NVRTC_THREADS when set (>= 1), else the
// machine's cores. NVRTC compiles separate programs concurrently.
unsigned thread_count(size_t tasks) {
  unsigned n = std::max(1u, std::thread::hardware_concurrency());
  if (const char* env = std::getenv("KILN_NVRTC_THREADS")) {
    int v = std::atoi(env);
    if (v >= 1) n = static_cast<unsigned>(v);
  }
  return static_cast<unsigned>(std::min<size_t>(n, tasks));
}

struct SmTask {
  uint32_t sm = 0;
  ArtifactPtr result;
  std::exception_ptr error;
  double seconds = 0;
  bool done = false;
  bool reported = false;
};

std::string seconds_text(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f s", s);
  return buffer;
}

// Runs the SM compiles on worker threads; the calling thread reports
// progress (a line per SM once the compile has run a few seconds, and a
// line every kHeartbeat while it runs) and rethrows the first error, in SM
// order, once every thread is joined.
void run_tasks(const std::string& name, const std::string& source, std::vector<SmTask>& tasks,
               const std::function<void(const std::string&)>& progress) {
  constexpr auto kQuiet = std::chrono::seconds(3);      // shorter compiles say nothing more
  constexpr auto kHeartbeat = std::chrono::seconds(10);
  const auto start = Clock::now();
  std::mutex mutex;
  std::condition_variable changed;
  size_t next = 0;
  auto work = [&] {
    for (;;) {
      size_t index;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (next == tasks.size()) return;
        index = next++;
      }
      SmTask& task = tasks[index];
      const auto t0 = Clock::now();
      ArtifactPtr result;
      std::exception_ptr error;
      try {
        result = compile_sm(name, source, task.sm);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      task.result = std::move(result);
      task.error = error;
      task.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      task.done = true;
      changed.notify_all();
    }
  };
  const unsigned n = thread_count(tasks.size());
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i) threads.emplace_back(work);
  std::exception_ptr progress_error;
  std::unique_lock<std::mutex> lock(mutex);
  auto last_line = start;
  for (;;) {
    const bool all_done = std::all_of(tasks.begin(), tasks.end(), [](const SmTask& t) { return t.done; });
    std::vector<std::string> lines;
    const auto now = Clock::now();
    for (SmTask& t : tasks) {
      if (t.done && !t.reported && !t.error && now - start >= kQuiet)
        lines.push_back("NVRTC: " + name + " for sm_" + std::to_string(t.sm) + " done in " + seconds_text(t.seconds));
      if (t.done) t.reported = true;
    }
    if (lines.empty() && !all_done && now - last_line >= kHeartbeat) {
      std::string waiting;
      for (const SmTask& t : tasks)
        if (!t.done) waiting += " sm_" + std::to_string(t.sm);
      lines.push_back("NVRTC: still compiling " + name + " for" + waiting + " (" +
                      seconds_text(std::chrono::duration<double>(now - start).count()) + ")");
    }
    if (!lines.empty()) {
      last_line = now;
      lock.unlock();
      if (progress && !progress_error) {
        try {
          for (const std::string& line : lines) progress(line);
        } catch (...) {
          progress_error = std::current_exception();  // rethrown after the join
        }
      }
      lock.lock();
    }
    if (all_done) break;
    changed.wait_for(lock, std::chrono::seconds(1));
  }
  lock.unlock();
  for (std::thread& t : threads) t.join();
  if (progress_error) std::rethrow_exception(progress_error);
  for (const SmTask& t : tasks)
    if (t.error) std::rethrow_exception(t.error);
}

}  // namespace

engine::KernelModule compile_module(const std::string& name, const std::string& source,
                                    const std::vector<uint32_t>& target_sms, bool emit_ptx,
                                    const std::function<void(const std::string&)>& progress) {
  if (target_sms.empty()) throw CompileError("no target SMs given");
  engine::KernelModule module;
  module.name = name;
  module.source = source;
  std::vector<SmTask> tasks;
  for (uint32_t sm : target_sms) {
    SmTask task;
    task.sm = sm;
    tasks.push_back(task);
  }
  run_tasks(name, source, tasks, progress);
  for (const SmTask& task : tasks) {
    engine::CubinImage image;
    image.sm = task.sm;
    image.image = task.result->cubin;
    module.cubins.push_back(std::move(image));
  }
  if (emit_ptx) {
    // The newest SM's compile already made the compute_<newest> PTX.
    uint32_t newest = *std::max_element(target_sms.begin(), target_sms.end());
    const SmTask& task = *std::find_if(tasks.begin(), tasks.end(), [&](const SmTask& t) { return t.sm == newest; });
    module.ptx = task.result->ptx.empty() ? compile_ptx_only(name, source, newest) : task.result->ptx;
    module.ptx_sm = newest;
  }
  return module;
}

std::string compile_ptx_only(const std::string& name, const std::string& source, uint32_t sm) {
  cache().count_compile();
  Program program = compile(name, source, "compute_" + std::to_string(sm));
  std::string ptx = program_ptx(program);
  if (ptx.empty()) throw CompileError("NVRTC produced no PTX for module '" + name + "'");
  return ptx;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

NvrtcCacheStats nvrtc_cache_stats() { return cache().stats(); }

void clear_nvrtc_cache() { cache().clear(); }

}  // namespace kiln::codegen
