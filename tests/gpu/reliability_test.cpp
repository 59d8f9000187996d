// GPU reliability tests of issue 13 (bad inputs, concurrency, resources), on
// the .pte files exported by tests/gpu/export_reliability_tests.py; run by
// scripts/gpu_reliability_tests.sh on the GPU machine:
//
//   kiln_reliability_test DIR [--runs=10000] [--threads=8] [--stream_runs=4000]
//                             [--cycles=1000] [--only=bad_inputs,threads,streams,cycles,oom,sm]
//
//   bad_inputs  wrong dtype, shape, rank, dim order, too few inputs, a CPU tensor for a
//               device-resident program, through executorch::extension::Module: each is
//               refused, with the Error ExecuTorch or KilnBackend returns and the log line
//   threads     THREADS threads x RUNS runs, each thread its own Module on one shared
//               engine (half replaying CUDA graphs), outputs vs a reference computed once;
//               the deep MLP, then a split decode attention (its per-split partial
//               states live in each context's own arena)
//   streams     one device-resident Module, runs alternating between two caller streams
//               (kiln::CallerStreamGuard) with device-only I/O, every output checked
//   cycles      CYCLES load/run/destroy cycles: host RSS and device memory growth < 1 MB
//   oom         an engine whose arena exceeds the GPU's memory: kOutOfMemory (runtime),
//               MemoryAllocationFailed (KilnBackend::init); nothing leaks
//   sm          an sm_87-only engine without PTX: DelegateInvalidCompatibility naming both SMs
//
// One line per check (PASS / FAIL / INFO / LIMIT); exit 1 if any failed. Without a GPU
// it prints one SKIP line and exits 0.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <kiln/caller_stream.h>

#include "engine_format/engine_format.h"
#include "runtime/engine_cache.h"
#include "runtime/execution_context.h"
#include "tensor_file.h"
#include "tensor_math.h"

namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::Module;
using kiln::tools::HostTensor;

int g_failures = 0;

void report(bool ok, const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  std::printf("%s  %s\n", ok ? "PASS" : "FAIL", text);
  std::fflush(stdout);
  g_failures += ok ? 0 : 1;
}

// ---- ExecuTorch log capture: every ET_LOG line is kept (and echoed to stderr).
std::mutex g_log_mutex;
std::string g_log;

void capture_log(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t,
                 const char* message, size_t length) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_log.size() < (1u << 20)) g_log.append(message, length).append("\n");
  std::fprintf(stderr, "[ET %c] %.*s\n", static_cast<char>(level), static_cast<int>(length),
               message);
}

void clear_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log.clear();
}

std::string log_text() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_log;
}

// The first captured line containing `needle`, or "".
std::string log_line(const char* needle) {
  const std::string text = log_text();
  const size_t at = text.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at);
  const size_t end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     (end == std::string::npos ? text.size() : end) -
                         (begin == std::string::npos ? 0 : begin + 1));
}

const char* error_name(et::Error e) { return et::to_string(e); }

// ---- helpers
size_t rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t free_device_bytes() {
  (void)cudaDeviceSynchronize();
  size_t free_bytes = 0, total = 0;
  (void)cudaMemGetInfo(&free_bytes, &total);
  return free_bytes;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

std::unique_ptr<Module> load_module(const std::string& pte, int graphs /*-1 unset*/,
                                    et::Error* error) {
  auto module = std::make_unique<Module>(pte, Module::LoadMode::Mmap);
  et::BackendOptions<1> opts;
  et::LoadBackendOptionsMap map;
  if (graphs >= 0) {
    (void)opts.set_option("use_cuda_graphs", graphs == 1);
    (void)map.set_options("KilnBackend", opts.view());
  }
  et::Error e = module->load(map, et::Program::Verification::InternalConsistency);
  if (e == et::Error::Ok)
    e = module->load_method("forward", nullptr, nullptr, &module->backend_options());
  *error = e;
  return e == et::Error::Ok ? std::move(module) : nullptr;
}

HostTensor to_host(const executorch::aten::Tensor& t) {
  HostTensor h;
  h.dtype = kiln::engine::DType::kFloat32;
  h.shape.assign(t.sizes().begin(), t.sizes().end());
  h.data.resize(t.nbytes());
  if (t.nbytes() == 0) return h;
  if (t.device_type() == executorch::aten::DeviceType::CPU)
    std::memcpy(h.data.data(), t.const_data_ptr(), t.nbytes());
  else
    (void)cudaMemcpy(h.data.data(), t.const_data_ptr(), t.nbytes(), cudaMemcpyDeviceToHost);
  return h;
}

HostTensor random_input(std::vector<int64_t> shape, unsigned seed) {
  HostTensor t;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(t.numel()) * sizeof(float));
  std::mt19937 rng(seed);
  kiln::tools::fill_random(&t, &rng);
  return t;
}

// Runs `m` on float32 `in` (host I/O); false (and *error) when refused.
bool run_host(Module& m, HostTensor& in, HostTensor* out, et::Error* error) {
  std::vector<executorch::aten::SizesType> sizes(in.shape.begin(), in.shape.end());
  auto t = executorch::extension::from_blob(in.data.data(), sizes, ScalarType::Float);
  auto result = m.execute("forward", std::vector<et::EValue>{et::EValue(*t)});
  *error = result.error();
  if (!result.ok() || result->empty() || !(*result)[0].isTensor()) return false;
  *out = to_host((*result)[0].toTensor());
  return true;
}

bool close_enough(const HostTensor& got, const HostTensor& want, double rtol) {
  if (got.shape != want.shape || got.data.size() != want.data.size()) return false;
  const kiln::tools::Comparison c = kiln::tools::compare_tensors(got, want);
  return c.non_finite == 0 && c.rel_err <= rtol;
}

// ---------------------------------------------------------------- bad inputs
void bad_input_case(const char* what, Module& m, std::vector<et::EValue> inputs,
                    et::Error want, const char* who_hint) {
  clear_log();
  auto result = m.execute("forward", inputs);
  const et::Error got = result.error();
  const std::string delegate_line = log_line("KilnBackend: input");
  const bool by_delegate = !delegate_line.empty();
  const bool ok = got == want;
  report(ok, "bad input: %s -> %s (expected %s), refused by %s%s%s", what, error_name(got),
         error_name(want), by_delegate ? "KilnBackend" : "ExecuTorch before the delegate",
         by_delegate ? ": " : "", by_delegate ? delegate_line.c_str() : who_hint);
}

void check_bad_inputs(const std::string& dir) {
  et::Error e;
  auto m = load_module(dir + "/tiny_mlp.pte", -1, &e);
  if (!m) return report(false, "bad input: cannot load tiny_mlp.pte (%s)", error_name(e));
  auto in = kiln::tools::read_tensor_file(dir + "/tiny_mlp.inputs.ktensors");
  auto want = kiln::tools::read_tensor_file(dir + "/tiny_mlp.expected.ktensors");
  if (!in.is_ok() || !want.is_ok()) return report(false, "bad input: cannot read tiny_mlp tensors");
  HostTensor x = in.value()[0], out;
  const bool good = run_host(*m, x, &out, &e) && close_enough(out, want.value()[0], 1e-5);
  report(good, "bad input: control run with the right input matches PyTorch (%s)",
         error_name(e));

  std::vector<double> d(64, 0.5);
  std::vector<float> f(64 * 2, 0.5f);
  auto as_double = executorch::extension::from_blob(d.data(), {4, 16}, ScalarType::Double);
  bad_input_case("dtype float64 for float32 [4, 16]", *m, {et::EValue(*as_double)},
                 et::Error::InvalidArgument, " (Method::set_input: scalar type)");
  auto wrong_shape = executorch::extension::from_blob(f.data(), {4, 17}, ScalarType::Float);
  // A static-shape input cannot be resized: resize_tensor refuses (NotSupported).
  bad_input_case("shape [4, 17] for [4, 16]", *m, {et::EValue(*wrong_shape)},
                 et::Error::NotSupported, " (Method::set_input: resize_tensor)");
  auto wrong_rank = executorch::extension::from_blob(f.data(), {64}, ScalarType::Float);
  bad_input_case("rank 1 [64] for [4, 16]", *m, {et::EValue(*wrong_rank)},
                 et::Error::NotSupported, " (Method::set_input: resize_tensor)");

  // Too few inputs: a fresh Module (a used one keeps its last inputs set).
  auto fresh = load_module(dir + "/tiny_mlp.pte", -1, &e);
  if (fresh)
    bad_input_case("no inputs for 1", *fresh, {}, et::Error::InvalidArgument,
                   " (Method::execute: input 0 not set)");

  // Non-contiguous dim order: the same values stored transposed ({1, 0}).
  {
    HostTensor xt = x;
    const float* src = reinterpret_cast<const float*>(x.data.data());
    float* dst = reinterpret_cast<float*>(xt.data.data());
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 16; ++c) dst[c * 4 + r] = src[r * 16 + c];
    auto t = executorch::extension::make_tensor_ptr(
        std::vector<executorch::aten::SizesType>{4, 16}, xt.data.data(),
        std::vector<executorch::aten::DimOrderType>{1, 0},
        std::vector<executorch::aten::StridesType>{1, 4}, ScalarType::Float);
    clear_log();
    auto result = m->execute("forward", std::vector<et::EValue>{et::EValue(*t)});
    if (!result.ok()) {
      const std::string line = log_line("KilnBackend: input");
      report(true, "bad input: dim order {1, 0} refused: %s%s%s", error_name(result.error()),
             line.empty() ? " by ExecuTorch" : " by KilnBackend: ", line.c_str());
    } else {
      // ExecuTorch 1.5.1 copies (or shares) the bytes into the method's planned,
      // contiguous input without looking at the dim order; the delegate then sees
      // a contiguous tensor and cannot tell.
      const HostTensor got = to_host((*result)[0].toTensor());
      const bool same = close_enough(got, want.value()[0], 1e-5);
      std::printf("LIMIT  bad input: dim order {1, 0} is accepted by ExecuTorch's "
                  "Method::set_input (bytes copied as if contiguous; the delegate only sees the "
                  "method's contiguous tensor): output %s PyTorch's\n",
                  same ? "matches" : "differs from");
    }
  }

  // A CPU tensor given to a device-resident program.
  auto dev = load_module(dir + "/tiny_mlp_device_io.pte", -1, &e);
  if (!dev) return report(false, "bad input: cannot load tiny_mlp_device_io.pte (%s)", error_name(e));
  void* out_buffer = nullptr;
  if (cudaMalloc(&out_buffer, 4 * 8 * sizeof(float)) != cudaSuccess)
    return report(false, "bad input: cudaMalloc failed");
  auto out_t = executorch::extension::make_tensor_ptr(
      std::vector<executorch::aten::SizesType>{4, 8}, out_buffer, ScalarType::Float,
      executorch::aten::Device(executorch::aten::DeviceType::CUDA, 0));
  const et::Error set = dev->set_output("forward", et::EValue(*out_t), 0);
  if (set != et::Error::Ok) {
    report(false, "bad input: set_output on the device-resident program: %s", error_name(set));
  } else {
    HostTensor host_x = x;
    auto cpu = executorch::extension::from_blob(host_x.data.data(), {4, 16}, ScalarType::Float);
    bad_input_case("CPU tensor for a device-resident program", *dev, {et::EValue(*cpu)},
                   et::Error::InvalidArgument, " (Method::set_input)");
    // A device tensor that starts 4 bytes into its allocation: the engine's
    // kernels load 16-byte vectors, so it is refused, naming the alignment.
    void* in_buffer = nullptr;
    if (cudaMalloc(&in_buffer, 4 * 16 * sizeof(float) + 256) != cudaSuccess) {
      report(false, "bad input: cudaMalloc failed");
    } else {
      auto shifted = executorch::extension::make_tensor_ptr(
          std::vector<executorch::aten::SizesType>{4, 16}, static_cast<char*>(in_buffer) + 4, ScalarType::Float,
          executorch::aten::Device(executorch::aten::DeviceType::CUDA, 0));
      clear_log();
      auto result = dev->execute("forward", std::vector<et::EValue>{et::EValue(*shifted)});
      const std::string line = log_line("aligned");
      report(!result.ok() && result.error() == et::Error::InvalidArgument && !line.empty(),
             "bad input: misaligned device input -> %s (expected InvalidArgument naming the alignment): %s",
             error_name(result.error()), line.empty() ? "(no log line)" : line.c_str());
      (void)cudaFree(in_buffer);
    }
  }
  (void)cudaFree(out_buffer);
}

// ---------------------------------------------------------------- threads
// `name`.pte (one float32 input of `shape`) from THREADS threads at once.
void check_threads(const std::string& dir, const std::string& name, const std::vector<int64_t>& shape,
                   int n_threads, int runs) {
  const std::string pte = dir + "/" + name + ".pte";
  constexpr int kSets = 4;
  std::vector<HostTensor> inputs, reference(kSets);
  et::Error e;
  {
    auto ref = load_module(pte, 0, &e);
    if (!ref) return report(false, "threads: cannot load %s.pte (%s)", name.c_str(), error_name(e));
    for (int k = 0; k < kSets; ++k) {
      inputs.push_back(random_input(shape, 100 + k));
      HostTensor in = inputs.back();
      if (!run_host(*ref, in, &reference[k], &e))
        return report(false, "threads: reference run failed (%s)", error_name(e));
    }
  }
  std::vector<std::unique_ptr<Module>> modules(n_threads);
  for (int t = 0; t < n_threads; ++t) {
    modules[t] = load_module(pte, t % 2, &e);  // engines shared (the default); half replay graphs
    if (!modules[t]) return report(false, "threads: load %d failed (%s)", t, error_name(e));
  }
  const size_t live_engines = kiln::runtime::shared_engine_count();
  std::atomic<long> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<HostTensor> mine = inputs;  // from_blob wants mutable memory
      HostTensor out;
      et::Error error;
      for (int i = 0; i < runs; ++i) {
        const int k = (i + t) % kSets;
        if (!run_host(*modules[t], mine[k], &out, &error)) {
          if (errors++ < 3) std::fprintf(stderr, "thread %d run %d: %s\n", t, i, error_name(error));
        } else if (!close_enough(out, reference[k], 1e-6)) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  report(mismatches == 0 && errors == 0,
         "threads: %s, %d threads x %d runs on one shared engine (%zu live engine(s) in the cache; "
         "half replaying graphs), outputs vs a reference computed once: %ld mismatches, %ld "
         "errors",
         name.c_str(), n_threads, runs, live_engines, mismatches.load(), errors.load());
}

// ---------------------------------------------------------------- streams
void check_streams(const std::string& dir, int runs) {
  et::Error e;
  auto ref = load_module(dir + "/deep_mlp.pte", 0, &e);
  auto m = load_module(dir + "/deep_mlp_device_io.pte", 0, &e);
  if (!ref || !m) return report(false, "streams: cannot load deep_mlp(_device_io).pte (%s)", error_name(e));
  constexpr int kSets = 4, kRing = 16;
  constexpr size_t kBytes = 256 * 256 * sizeof(float);
  const executorch::aten::Device cuda(executorch::aten::DeviceType::CUDA, 0);
  std::vector<HostTensor> reference(kSets);
  std::vector<void*> in_dev(kSets, nullptr), out_dev(kRing, nullptr);
  std::vector<executorch::extension::TensorPtr> in_t, out_t;
  void* pinned = nullptr;
  cudaStream_t streams[2] = {nullptr, nullptr};
  bool setup = cudaHostAlloc(&pinned, kRing * kBytes, cudaHostAllocDefault) == cudaSuccess &&
               cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking) == cudaSuccess &&
               cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking) == cudaSuccess;
  for (int k = 0; setup && k < kSets; ++k) {
    HostTensor in = random_input({256, 256}, 200 + k);
    HostTensor keep = in;
    setup = run_host(*ref, keep, &reference[k], &e) &&
            cudaMalloc(&in_dev[k], kBytes) == cudaSuccess &&
            cudaMemcpy(in_dev[k], in.data.data(), kBytes, cudaMemcpyHostToDevice) == cudaSuccess;
    in_t.push_back(executorch::extension::make_tensor_ptr(
        std::vector<executorch::aten::SizesType>{256, 256}, in_dev[k], ScalarType::Float, cuda));
  }
  for (int r = 0; setup && r < kRing; ++r) {
    setup = cudaMalloc(&out_dev[r], kBytes) == cudaSuccess;
    out_t.push_back(executorch::extension::make_tensor_ptr(
        std::vector<executorch::aten::SizesType>{256, 256}, out_dev[r], ScalarType::Float, cuda));
  }
  long mismatches = 0, errors = 0, checked = 0;
  if (!setup) {
    report(false, "streams: setup failed (%s)", error_name(e));
  } else {
    for (int base = 0; base < runs; base += kRing) {
      for (int j = 0; j < kRing; ++j) {
        const int i = base + j;
        cudaStream_t s = streams[i % 2];
        et::Error err = m->set_output("forward", et::EValue(*out_t[j]), 0);
        if (err == et::Error::Ok) {
          kiln::CallerStreamGuard guard(s);
          auto result = m->execute("forward", std::vector<et::EValue>{et::EValue(*in_t[i % kSets])});
          err = result.error();
        }
        if (err != et::Error::Ok) {
          if (errors++ < 3) std::fprintf(stderr, "streams run %d: %s\n", i, error_name(err));
          continue;
        }
        (void)cudaMemcpyAsync(static_cast<uint8_t*>(pinned) + j * kBytes, out_dev[j], kBytes,
                              cudaMemcpyDeviceToHost, s);
      }
      if (cudaDeviceSynchronize() != cudaSuccess) {
        ++errors;
        break;
      }
      for (int j = 0; j < kRing; ++j) {
        HostTensor got;
        got.shape = {256, 256};
        const uint8_t* p = static_cast<const uint8_t*>(pinned) + j * kBytes;
        got.data.assign(p, p + kBytes);
        mismatches += close_enough(got, reference[(base + j) % kSets], 1e-6) ? 0 : 1;
        ++checked;
      }
    }
    report(mismatches == 0 && errors == 0,
           "streams: %ld runs alternating between 2 caller streams (CallerStreamGuard), "
           "device-only I/O, each output checked: %ld mismatches, %ld errors",
           checked, mismatches, errors);
  }
  for (void* p : in_dev) (void)cudaFree(p);
  for (void* p : out_dev) (void)cudaFree(p);
  if (pinned != nullptr) (void)cudaFreeHost(pinned);
  for (cudaStream_t s : streams)
    if (s != nullptr) (void)cudaStreamDestroy(s);
}

// ---------------------------------------------------------------- cycles
void check_cycles(const std::string& dir, int cycles) {
  const std::string pte = dir + "/tiny_mlp.pte";
  auto in = kiln::tools::read_tensor_file(dir + "/tiny_mlp.inputs.ktensors");
  auto want = kiln::tools::read_tensor_file(dir + "/tiny_mlp.expected.ktensors");
  if (!in.is_ok() || !want.is_ok()) return report(false, "cycles: cannot read tiny_mlp tensors");
  const int warmup = std::min(50, cycles / 10 + 1);
  size_t rss0 = 0, dev0 = 0;
  long failures = 0;
  for (int c = 0; c < warmup + cycles; ++c) {
    if (c == warmup) {
      rss0 = rss_bytes();
      dev0 = free_device_bytes();
    }
    et::Error e;
    auto m = load_module(pte, c % 2, &e);
    HostTensor x = in.value()[0], out;
    if (!m || !run_host(*m, x, &out, &e) || !close_enough(out, want.value()[0], 1e-5)) {
      if (failures++ < 3) std::fprintf(stderr, "cycle %d: %s\n", c, error_name(e));
    }
  }
  const double rss_growth = static_cast<double>(rss_bytes()) - static_cast<double>(rss0);
  const double dev_growth = static_cast<double>(dev0) - static_cast<double>(free_device_bytes());
  report(failures == 0 && rss_growth < 1e6 && dev_growth < 1e6,
         "cycles: %d load/run/destroy cycles after %d warm-up: host RSS %+.3f MiB, device "
         "memory %+.3f MiB (limit 1 MB each), %ld failed runs",
         cycles, warmup, mib(rss_growth), mib(dev_growth), failures);
}

// ---------------------------------------------------------------- oom
void check_oom(const std::string& dir) {
  std::ifstream file(dir + "/tiny_mlp.engine", std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto desc = kiln::engine::parse_engine(bytes.data(), bytes.size());
  if (!desc.is_ok())
    return report(false, "oom: cannot parse tiny_mlp.engine: %s", desc.status().message().c_str());
  size_t free_bytes = 0, total = 0;
  (void)cudaMemGetInfo(&free_bytes, &total);
  kiln::engine::EngineDesc huge = desc.value();
  huge.arena_bytes = static_cast<uint64_t>(total) + (1ull << 30);  // more than the GPU has
  auto blob = kiln::engine::serialize_engine(huge);
  if (!blob.is_ok())
    return report(false, "oom: cannot serialize: %s", blob.status().message().c_str());
  const std::vector<uint8_t>& b = blob.value();

  et::BackendInterface* backend = et::get_backend_class("KilnBackend");
  if (backend == nullptr) return report(false, "oom: KilnBackend is not registered");
  std::vector<uint8_t> handle_memory(4096);
  int device = 0;
  (void)cudaGetDevice(&device);

  auto attempt = [&](kiln::StatusCode* runtime_code, et::Error* delegate_error) {
    {
      auto engine = kiln::runtime::load_engine_shared(b.data(), b.size(), device, 0, true, nullptr, nullptr);
      if (!engine.is_ok()) {
        *runtime_code = engine.status().code();
      } else {
        auto context = kiln::runtime::ExecutionContext::create(engine.value());
        *runtime_code = context.is_ok() ? kiln::StatusCode::kOk : context.status().code();
      }
    }
    et::MemoryAllocator allocator(static_cast<uint32_t>(handle_memory.size()), handle_memory.data());
    et::BackendInitContext context(&allocator);
    et::FreeableBuffer processed(b.data(), b.size(), nullptr);
    auto handle = backend->init(context, &processed, et::ArrayRef<et::CompileSpec>());
    *delegate_error = handle.error();
    if (handle.ok()) backend->destroy(handle.get());
  };
  kiln::StatusCode code = kiln::StatusCode::kOk;
  et::Error error = et::Error::Ok;
  clear_log();
  attempt(&code, &error);  // warm-up: loads cuBLASLt etc. once
  const std::string line = log_line("KilnBackend: cannot initialize");
  const size_t rss0 = rss_bytes(), dev0 = free_device_bytes();
  bool same = true;
  for (int i = 0; i < 20; ++i) {
    kiln::StatusCode c;
    et::Error err;
    attempt(&c, &err);
    same &= c == code && err == error;
  }
  const double rss_growth = static_cast<double>(rss_bytes()) - static_cast<double>(rss0);
  const double dev_growth = static_cast<double>(dev0) - static_cast<double>(free_device_bytes());
  report(code == kiln::StatusCode::kOutOfMemory && error == et::Error::MemoryAllocationFailed &&
             same && rss_growth < 1e6 && dev_growth < 1e6,
         "oom: engine with a %.1f GiB arena on a %.1f GiB GPU: runtime %s, KilnBackend::init %s "
         "(\"%s\"); 20 more attempts: host RSS %+.3f MiB, device %+.3f MiB",
         static_cast<double>(huge.arena_bytes) / (1 << 30), static_cast<double>(total) / (1 << 30),
         code == kiln::StatusCode::kOutOfMemory ? "kOutOfMemory" : "NOT kOutOfMemory",
         error_name(error), line.c_str(), mib(rss_growth), mib(dev_growth));
}

// ---------------------------------------------------------------- sm
void check_sm(const std::string& dir) {
  cudaDeviceProp prop{};
  int device = 0;
  (void)cudaGetDevice(&device);
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return report(false, "sm: no properties");
  const int sm = prop.major * 10 + prop.minor;
  if (sm == 87) {
    std::printf("SKIP  sm: this GPU is sm_87, the engine's own SM\n");
    return;
  }
  clear_log();
  et::Error e;
  auto m = load_module(dir + "/tiny_mlp_sm87.pte", -1, &e);
  const std::string line = log_line("KilnBackend: cannot initialize");
  char this_sm[16];
  std::snprintf(this_sm, sizeof(this_sm), "sm_%d", sm);
  const bool names_both = line.find("sm_87") != std::string::npos &&
                          line.find(this_sm) != std::string::npos;
  report(!m && e == et::Error::DelegateInvalidCompatibility && names_both,
         "sm: sm_87-only engine without PTX on %s: %s (expected DelegateInvalidCompatibility); "
         "log: \"%s\"",
         this_sm, error_name(e), line.c_str());
}

bool wanted(const std::string& only, const char* name) {
  if (only.empty()) return true;
  const std::string list = "," + only + ",";
  return list.find(std::string(",") + name + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    std::printf("SKIP  kiln_reliability_test: no CUDA GPU (cudaGetDeviceCount: %s, %d devices)\n",
                probe == cudaSuccess ? "ok" : cudaGetErrorName(probe), count);
    return 0;
  }
  et::register_pal(et::PalImpl::create(&capture_log, __FILE__));
  et::runtime_init();
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s DIR [--runs=N] [--threads=N] [--stream_runs=N] [--cycles=N] "
                 "[--only=bad_inputs,threads,streams,cycles,oom,sm]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int runs = 10000, threads = 8, stream_runs = 4000, cycles = 1000;
  std::string only;
  for (int a = 2; a < argc; ++a) {
    const std::string arg = argv[a];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return arg.compare(0, n, key) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--runs=")) runs = std::atoi(v);
    else if (const char* v = value("--threads=")) threads = std::atoi(v);
    else if (const char* v = value("--stream_runs=")) stream_runs = std::atoi(v);
    else if (const char* v = value("--cycles=")) cycles = std::atoi(v);
    else if (const char* v = value("--only=")) only = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (wanted(only, "bad_inputs")) check_bad_inputs(dir);
  if (wanted(only, "sm")) check_sm(dir);
  if (wanted(only, "oom")) check_oom(dir);
  if (wanted(only, "streams")) check_streams(dir, stream_runs);
  if (wanted(only, "threads")) {
    check_threads(dir, "deep_mlp", {256, 256}, threads, runs);
    // Split decode attention: each context keeps its own per-split partial states.
    check_threads(dir, "split_attention", {8, 64}, threads, runs);
  }
  if (wanted(only, "cycles")) check_cycles(dir, cycles);
  std::printf("%d failed\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
