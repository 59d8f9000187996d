#include "codegen/nvrtc_compiler.h"

#include <nvJitLink.h>
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
#include <optional>
#include <sstream>
#include <thread>

#include "codegen/grid_dependency.h"
#include "codegen/kernel_disk_cache.h"
#include "ir/graph.h"

namespace kiln::codegen {
namespace {

using Clock = std::chrono::steady_clock;

void check(nvrtcResult result, const char* what) {
  if (result != NVRTC_SUCCESS) throw CompileError(std::string(what) + ": " + nvrtcGetErrorString(result));
}

// nvJitLink has no error-string function; its result codes are named here.
void check(nvJitLinkResult result, const char* what, const std::string& context) {
  if (result == NVJITLINK_SUCCESS) return;
  throw CompileError(std::string(what) + " failed (nvJitLinkResult " + std::to_string(static_cast<int>(result)) +
                     ") " + context);
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    nvrtcDestroyProgram(p);
    delete p;
  }
};
using Program = std::unique_ptr<nvrtcProgram, ProgramDeleter>;

// NVRTC's options besides the arch (part of the disk cache's key).
// No fast-math: results must match PyTorch's to float32 rounding.
constexpr const char* kNvrtcOptions = "--std=c++17 -default-device";

Program compile(const std::string& name, const std::string& source, const std::string& arch) {
  Program program(new nvrtcProgram(nullptr));
  check(nvrtcCreateProgram(program.get(), source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  std::string arch_flag = "--gpu-architecture=" + arch;
  const char* options[] = {arch_flag.c_str(), "--std=c++17", "-default-device"};  // = kNvrtcOptions
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

// A cached result: the PTX of a compute_XX compile, or one SM's cubin.
struct Artifact {
  std::vector<uint8_t> cubin;
  std::string ptx;
};
using ArtifactPtr = std::shared_ptr<const Artifact>;

// Results by (what was built, module name, source); the whole key is kept,
// so two sources never share an entry. Bounded by size, oldest dropped first.
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
  void count_disk(bool hit) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++(hit ? stats_.disk_hits : stats_.disk_writes);
  }
  void add_seconds(double s) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.seconds += s;
  }
  // `assembled`: a PTX->cubin step (nvJitLink), else an NVRTC compile;
  // `built`: false when the artifact came from the disk cache.
  void put(const std::string& key, ArtifactPtr artifact, bool assembled, bool built = true) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (built) ++(assembled ? stats_.assembles : stats_.compiles);
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

// NVRTC's PTX for compute_<sm>: the one front-end compile a module gets.
ArtifactPtr compile_ptx(const std::string& name, const std::string& source, uint32_t sm) {
  const std::string arch = "compute_" + std::to_string(sm);
  const std::string key = cache_key(arch, name, source);
  if (ArtifactPtr hit = cache().find(key)) return hit;
  const std::string dir = kernel_cache_dir();
  const std::string disk_key = dir.empty() ? std::string() : kernel_cache_key("ptx " + arch + " " + kNvrtcOptions, name, source);
  if (!dir.empty()) {
    if (std::optional<std::string> stored = kernel_cache_read(dir, disk_key); stored && !stored->empty()) {
      auto artifact = std::make_shared<Artifact>();
      artifact->ptx = std::move(*stored);
      cache().count_disk(true);
      cache().put(key, artifact, false, false);
      return artifact;
    }
  }
  Program program = compile(name, source, arch);
  auto artifact = std::make_shared<Artifact>();
  artifact->ptx = program_ptx(program);
  if (artifact->ptx.empty()) throw CompileError("NVRTC produced no PTX for module '" + name + "'");
  cache().put(key, artifact, false);
  if (!dir.empty() && kernel_cache_write(dir, disk_key, artifact->ptx)) cache().count_disk(false);
  return artifact;
}

struct LinkDeleter {
  void operator()(nvJitLinkHandle* h) const {
    nvJitLinkDestroy(h);
    delete h;
  }
};

// The cubin for sm_<sm> from `ptx` (compute_<ptx_sm>), by nvJitLink (ptxas).
// With `grid_dependency` the PTX first gets griddepcontrol (grid_dependency.h).
ArtifactPtr assemble(const std::string& name, const std::string& source, const std::string& ptx, uint32_t ptx_sm,
                     uint32_t sm, bool grid_dependency) {
  const std::string arch = "sm_" + std::to_string(sm);
  const std::string built_from = arch + "<compute_" + std::to_string(ptx_sm) + (grid_dependency ? "+griddepcontrol" : "");
  const std::string key = cache_key(built_from, name, source);
  if (ArtifactPtr hit = cache().find(key)) return hit;
  const std::string dir = kernel_cache_dir();
  const std::string disk_key =
      dir.empty() ? std::string() : kernel_cache_key("cubin " + built_from, name, source);
  if (!dir.empty()) {
    if (std::optional<std::string> stored = kernel_cache_read(dir, disk_key); stored && !stored->empty()) {
      auto artifact = std::make_shared<Artifact>();
      artifact->cubin.assign(stored->begin(), stored->end());
      cache().count_disk(true);
      cache().put(key, artifact, true, false);
      return artifact;
    }
  }
  const std::string context = "assembling module '" + name + "' for " + arch;
  const std::string arch_flag = "-arch=" + arch;
  const char* options[] = {arch_flag.c_str()};
  const std::string patched = grid_dependency ? add_grid_dependency(ptx) : std::string();
  const std::string& input = grid_dependency ? patched : ptx;
  std::unique_ptr<nvJitLinkHandle, LinkDeleter> link(new nvJitLinkHandle(nullptr));
  check(nvJitLinkCreate(link.get(), 1, options), "nvJitLinkCreate", context);
  nvJitLinkResult result = nvJitLinkAddData(*link, NVJITLINK_INPUT_PTX, input.data(), input.size(), name.c_str());
  if (result == NVJITLINK_SUCCESS) result = nvJitLinkComplete(*link);
  if (result != NVJITLINK_SUCCESS) {
    size_t log_size = 0;
    std::string log;
    if (nvJitLinkGetErrorLogSize(*link, &log_size) == NVJITLINK_SUCCESS && log_size > 1) {
      log.resize(log_size);
      if (nvJitLinkGetErrorLog(*link, log.data()) != NVJITLINK_SUCCESS) log.clear();
      while (!log.empty() && log.back() == '\0') log.pop_back();
    }
    check(result, "nvJitLink", context + (log.empty() ? "" : ":\n" + log));
  }
  auto artifact = std::make_shared<Artifact>();
  size_t size = 0;
  check(nvJitLinkGetLinkedCubinSize(*link, &size), "nvJitLinkGetLinkedCubinSize", context);
  artifact->cubin.resize(size);
  check(nvJitLinkGetLinkedCubin(*link, artifact->cubin.data()), "nvJitLinkGetLinkedCubin", context);
  cache().put(key, artifact, true);
  if (!dir.empty() &&
      kernel_cache_write(dir, disk_key, std::string(artifact->cubin.begin(), artifact->cubin.end())))
    cache().count_disk(false);
  return artifact;
}

// Worker threads for the SMs: KILN_NVRTC_THREADS when set (>= 1), else the
// machine's cores. nvJitLink assembles separate handles concurrently.
unsigned thread_count(size_t tasks) {
  unsigned n = std::max(1u, std::thread::hardware_concurrency());
  if (const char* env = std::getenv("KILN_NVRTC_THREADS")) {
    int v = std::atoi(env);
    if (v >= 1) n = static_cast<unsigned>(v);
  }
  return static_cast<unsigned>(std::min<size_t>(n, tasks));
}

// One unit of parallel work: a module's PTX, or one SM's cubin of it.
struct Task {
  std::string what;  // for progress lines: "kiln_kernels cubin for sm_90"
  std::function<ArtifactPtr()> run;
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

// Runs `tasks` on worker threads; the calling thread reports progress (a line
// per task once the batch has run a few seconds, and a line every kHeartbeat
// while it runs) and rethrows the first error, in task order, once every
// thread is joined. Only the calling thread calls `progress`.
void run_tasks(std::vector<Task>& tasks, const std::function<void(const std::string&)>& progress) {
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
      Task& task = tasks[index];
      const auto t0 = Clock::now();
      ArtifactPtr result;
      std::exception_ptr error;
      try {
        result = task.run();
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
    const bool all_done = std::all_of(tasks.begin(), tasks.end(), [](const Task& t) { return t.done; });
    std::vector<std::string> lines;
    const auto now = Clock::now();
    for (Task& t : tasks) {
      if (t.done && !t.reported && !t.error && now - start >= kQuiet)
        lines.push_back("NVRTC: " + t.what + " done in " + seconds_text(t.seconds));
      if (t.done) t.reported = true;
    }
    if (lines.empty() && !all_done && now - last_line >= kHeartbeat) {
      size_t waiting = 0;
      std::string first;
      for (const Task& t : tasks)
        if (!t.done && waiting++ == 0) first = t.what;
      lines.push_back("NVRTC: still compiling " + first +
                      (waiting > 1 ? " and " + std::to_string(waiting - 1) + " more" : std::string()) + " (" +
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
  for (const Task& t : tasks)
    if (t.error) std::rethrow_exception(t.error);
}

}  // namespace

std::vector<engine::KernelModule> compile_modules(const std::vector<ModuleSource>& sources,
                                                  const std::vector<uint32_t>& target_sms, bool emit_ptx,
                                                  const std::function<void(const std::string&)>& progress,
                                                  bool grid_dependency) {
  if (target_sms.empty()) throw CompileError("no target SMs given");
  const auto start = Clock::now();
  struct AddSeconds {
    Clock::time_point start;
    ~AddSeconds() { cache().add_seconds(std::chrono::duration<double>(Clock::now() - start).count()); }
  } add_seconds{start};
  // One NVRTC front-end compile per module, for the oldest SM: its PTX runs
  // on every target (the planner chose kernels for that SM:
  // OpOptions::min_target_sm). The modules compile in parallel, then every
  // (module, SM) cubin does.
  const uint32_t oldest = *std::min_element(target_sms.begin(), target_sms.end());
  std::vector<Task> ptx_tasks;
  for (const ModuleSource& m : sources) {
    Task t;
    t.what = m.name + " to PTX compute_" + std::to_string(oldest);
    t.run = [&m, oldest] { return compile_ptx(m.name, m.source, oldest); };
    ptx_tasks.push_back(std::move(t));
  }
  run_tasks(ptx_tasks, progress);
  std::vector<Task> sm_tasks;
  for (size_t i = 0; i < sources.size(); ++i)
    for (uint32_t sm : target_sms) {
      Task t;
      t.what = sources[i].name + " cubin for sm_" + std::to_string(sm);
      const ModuleSource& m = sources[i];
      const std::string& ptx = ptx_tasks[i].result->ptx;
      t.run = [&m, &ptx, oldest, sm, grid_dependency] {
        return assemble(m.name, m.source, ptx, oldest, sm, grid_dependency && sm >= kGridDependencyMinSm);
      };
      sm_tasks.push_back(std::move(t));
    }
  run_tasks(sm_tasks, progress);
  std::vector<engine::KernelModule> modules(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    engine::KernelModule& module = modules[i];
    module.name = sources[i].name;
    module.source = sources[i].source;
    for (size_t j = 0; j < target_sms.size(); ++j) {
      engine::CubinImage image;
      image.sm = target_sms[j];
      image.image = sm_tasks[i * target_sms.size() + j].result->cubin;
      module.cubins.push_back(std::move(image));
    }
    if (emit_ptx) {
      module.ptx = ptx_tasks[i].result->ptx;
      module.ptx_sm = oldest;
    }
  }
  return modules;
}

engine::KernelModule compile_module(const std::string& name, const std::string& source,
                                    const std::vector<uint32_t>& target_sms, bool emit_ptx,
                                    const std::function<void(const std::string&)>& progress, bool grid_dependency) {
  return std::move(compile_modules({ModuleSource{name, source}}, target_sms, emit_ptx, progress, grid_dependency).at(0));
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

NvrtcCacheStats nvrtc_cache_stats() { return cache().stats(); }

void clear_nvrtc_cache() { cache().clear(); }

}  // namespace kiln::codegen
