// GPU test of the runtime features behind KilnBackend's options, run on the
// GPU machine by tests/gpu/runtime_features_test.py, which draws fresh random
// inputs and computes PyTorch's outputs (.ktensors files) for each model:
//   graphs   CUDA graph replay gives the same results as normal runs while
//            input values change; counters show one recording per engine
//   threads  4 threads, each with its own Module (engines shared) and its own
//            stream (kiln::CallerStreamGuard), half of them replaying graphs
//   memory   device memory of a second load with and without shared engines,
//            and of a many-engine model with and without the shared scratch
//   speed    median execute() latency with and without graph replay
//   hashing  cost of hashing engine bytes (the shared-engine cache key)
// Prints one line per check and exits 1 if any failed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/runtime.h>
#include <kiln/caller_stream.h>

#include "runtime/engine_cache.h"
#include "gpu_test_util.h"
#include "tensor_file.h"
#include "tensor_math.h"

namespace {

namespace et = executorch::runtime;
using executorch::extension::Module;
using kiln::tools::HostTensor;

using kiln::gpu_test::report;

struct Case {
  std::string pte;
  std::vector<HostTensor> inputs;    // one input tensor per set
  std::vector<HostTensor> expected;  // one output tensor per set
  double rtol = 1e-5;
};

size_t free_device_bytes() {
  cudaDeviceSynchronize();
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return free_bytes;
}

double mib(long long bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

int get_counter(const char* key) {
  et::BackendOptions<1> q;
  // BackendOptions needs literal keys; map the few we use.
  if (!std::strcmp(key, "graph_launches")) (void)q.set_option("graph_launches", 0);
  else if (!std::strcmp(key, "graph_records")) (void)q.set_option("graph_records", 0);
  else if (!std::strcmp(key, "shared_engine_loads")) (void)q.set_option("shared_engine_loads", 0);
  else if (!std::strcmp(key, "h2d_copies")) (void)q.set_option("h2d_copies", 0);
  else (void)q.set_option("runs", 0);
  if (et::get_option("KilnBackend", q.view()) != et::Error::Ok) return -1;
  const int* v = std::get_if<int>(&q.view()[0].value);
  return v != nullptr ? *v : -1;
}

void set_process_option_scratch(bool on) {
  et::BackendOptions<1> o;
  (void)o.set_option("use_shared_activation_scratch", on);
  if (et::set_option("KilnBackend", o.view()) != et::Error::Ok) report(false, "set_option scratch");
}

// Loads `pte` with the given load options; nullptr after reporting a failure.
std::unique_ptr<Module> load(const std::string& pte, int graphs /*-1: unset*/,
                             int shared /*-1: unset*/) {
  auto module = std::make_unique<Module>(pte, Module::LoadMode::Mmap);
  et::BackendOptions<2> opts;
  if (graphs >= 0) (void)opts.set_option("use_cuda_graphs", graphs == 1);
  if (shared >= 0) (void)opts.set_option("use_shared_engines", shared == 1);
  et::LoadBackendOptionsMap map;
  if (graphs >= 0 || shared >= 0) (void)map.set_options("KilnBackend", opts.view());
  if (module->load(map) != et::Error::Ok ||
      module->load_method("forward", nullptr, nullptr, &module->backend_options()) !=
          et::Error::Ok) {
    report(false, "load " + pte);
    return nullptr;
  }
  return module;
}

// Runs input set `k` once and compares with PyTorch; returns the rel error.
bool run_and_check(Module& m, const Case& c, size_t k, double* rel_err) {
  HostTensor in = c.inputs[k];  // from_blob needs mutable data
  std::vector<executorch::aten::SizesType> sizes(in.shape.begin(), in.shape.end());
  auto t = executorch::extension::from_blob(in.data.data(), sizes, kiln::gpu_test::scalar_type(in.dtype));
  auto result = m.execute("forward", std::vector<et::EValue>{et::EValue(*t)});
  if (!result.ok() || result->empty() || !(*result)[0].isTensor()) return false;
  const auto& out = (*result)[0].toTensor();
  const HostTensor got = kiln::gpu_test::to_host(out, c.expected[k].dtype);
  if (got.shape != c.expected[k].shape) return false;
  const kiln::tools::Comparison cmp = kiln::tools::compare_tensors(got, c.expected[k]);
  *rel_err = cmp.rel_err;
  return cmp.non_finite == 0 && cmp.rel_err <= c.rtol;
}

double median_latency_ms(Module& m, const Case& c, int runs) {
  std::vector<double> ms;
  double err = 0;
  for (int r = 0; r < runs + 10; ++r) {
    const auto start = std::chrono::steady_clock::now();
    (void)run_and_check(m, c, r % c.inputs.size(), &err);
    const auto stop = std::chrono::steady_clock::now();
    if (r >= 10) ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void check_graphs(const std::string& name, const Case& c) {
  auto m = load(c.pte, /*graphs=*/1, -1);
  if (!m) return;
  const int launches0 = get_counter("graph_launches"), records0 = get_counter("graph_records");
  bool ok = true;
  double worst = 0;
  const size_t n = c.inputs.size();
  for (size_t r = 0; r < 2 * n; ++r) {  // every set twice, values change each run
    double err = 0;
    ok &= run_and_check(*m, c, r % n, &err);
    worst = std::max(worst, err);
  }
  const int launches = get_counter("graph_launches") - launches0;
  const int records = get_counter("graph_records") - records0;
  char text[256];
  std::snprintf(text, sizeof(text),
                "%s graphs: %zu runs match PyTorch (worst rel_err %.2e); %d graph launches, %d "
                "recordings",
                name.c_str(), 2 * n, worst, launches, records);
  report(ok && launches > 0 && records > 0 && launches == records * static_cast<int>(2 * n),
         text);
}

void check_speed(const std::string& name, const Case& c) {
  auto off = load(c.pte, 0, 0);
  auto on = load(c.pte, 1, 0);
  if (!off || !on) return;
  const double t_off = median_latency_ms(*off, c, 300);
  const double t_on = median_latency_ms(*on, c, 300);
  const double t_off2 = median_latency_ms(*off, c, 300);  // interleaved, for noise
  const double t_on2 = median_latency_ms(*on, c, 300);
  std::printf("INFO  %s execute() median: graphs off %.4f / %.4f ms, on %.4f / %.4f ms "
              "(speedup %.2fx)\n",
              name.c_str(), t_off, t_off2, t_on, t_on2,
              std::min(t_off, t_off2) / std::min(t_on, t_on2));
}

void check_threads(const std::string& name, const Case& c) {
  constexpr int kThreads = 4, kIters = 40;
  const int shared0 = get_counter("shared_engine_loads");
  std::atomic<int> failures{0};
  std::atomic<int> worst_bits{0};
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Module>> modules(kThreads);
  for (int t = 0; t < kThreads; ++t) modules[t] = load(c.pte, t % 2, -1);
  for (int t = 0; t < kThreads; ++t) {
    if (!modules[t]) return;
    threads.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        ++failures;
        return;
      }
      {
        kiln::CallerStreamGuard guard(stream);
        for (int i = 0; i < kIters; ++i) {
          double err = 0;
          if (!run_and_check(*modules[t], c, (i + t) % c.inputs.size(), &err)) ++failures;
          int bits = static_cast<int>(err * 1e9);
          int prev = worst_bits.load();
          while (bits > prev && !worst_bits.compare_exchange_weak(prev, bits)) {}
        }
      }
      cudaStreamDestroy(stream);
    });
  }
  for (auto& th : threads) th.join();
  const int shared = get_counter("shared_engine_loads") - shared0;
  char text[256];
  std::snprintf(text, sizeof(text),
                "%s threads: %d threads x %d runs on their own caller streams (2 replaying "
                "graphs) match PyTorch (worst rel_err %.2e); %d engine loads were shared",
                name.c_str(), kThreads, kIters, worst_bits.load() / 1e9, shared);
  report(failures == 0 && shared > 0, text);
}

void check_shared_engine_memory(const std::string& name, const Case& c) {
  const size_t f0 = free_device_bytes();
  auto first = load(c.pte, -1, 1);
  const size_t f1 = free_device_bytes();
  auto second_shared = load(c.pte, -1, 1);
  const size_t f2 = free_device_bytes();
  auto third_private = load(c.pte, -1, 0);
  const size_t f3 = free_device_bytes();
  if (!first || !second_shared || !third_private) return;
  double e1 = 0, e2 = 0, e3 = 0;
  const bool ok = run_and_check(*first, c, 0, &e1) && run_and_check(*second_shared, c, 1, &e2) &&
                  run_and_check(*third_private, c, 2, &e3);
  char text[320];
  std::snprintf(text, sizeof(text),
                "%s shared engines: first load +%.2f MiB, second load shared +%.2f MiB, third "
                "load private +%.2f MiB; all three match PyTorch",
                name.c_str(), mib(static_cast<long long>(f0) - f1),
                mib(static_cast<long long>(f1) - f2), mib(static_cast<long long>(f2) - f3));
  report(ok && (f1 - f2) < (f2 - f3), text);
}

void check_scratch_memory(const std::string& name, const Case& c) {
  const size_t f0 = free_device_bytes();
  auto own = load(c.pte, -1, 0);
  const size_t f1 = free_device_bytes();
  set_process_option_scratch(true);
  auto shared = load(c.pte, -1, 0);
  const size_t f2 = free_device_bytes();
  set_process_option_scratch(false);
  if (!own || !shared) return;
  bool ok = true;
  double worst = 0;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    double e = 0;
    ok &= run_and_check(*shared, c, k, &e) && run_and_check(*own, c, k, &e);
    worst = std::max(worst, e);
  }
  char text[320];
  std::snprintf(text, sizeof(text),
                "%s shared scratch: load with own arenas +%.2f MiB, with the shared scratch "
                "+%.2f MiB (both private engines); both match PyTorch (worst rel_err %.2e)",
                name.c_str(), mib(static_cast<long long>(f0) - f1),
                mib(static_cast<long long>(f1) - f2), worst);
  report(ok && (f1 - f2) <= (f0 - f1), text);
}

void check_hashing() {
  const size_t bytes = 256u << 20;
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  uint64_t h = kiln::runtime::hash_bytes(data.data(), bytes);  // warm the pages
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 4; ++r) h ^= kiln::runtime::hash_bytes(data.data(), bytes);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double us_per_mib = s * 1e6 / (4.0 * bytes / (1 << 20));
  std::printf("INFO  hashing engine bytes: %.1f us per MiB (%.2f GB/s) [%016llx]\n", us_per_mib,
              4.0 * bytes / s / 1e9, static_cast<unsigned long long>(h));
}

bool read_case(const std::string& pte, const std::string& prefix, int sets, double rtol,
               Case* c) {
  c->pte = pte;
  c->rtol = rtol;
  for (int k = 0; k < sets; ++k) {
    for (auto [suffix, list] : {std::make_pair(".inputs.ktensors", &c->inputs),
                                std::make_pair(".expected.ktensors", &c->expected)}) {
      const std::string path = prefix + "." + std::to_string(k) + suffix;
      auto r = kiln::tools::read_tensor_file(path);
      if (!r.is_ok() || r->size() != 1) {
        std::printf("FAIL  cannot read %s\n", path.c_str());
        return false;
      }
      list->push_back(r.value()[0]);
    }
  }
  return true;
}

}  // namespace

// usage: runtime_features_test SETS NAME PTE PREFIX RTOL [NAME PTE PREFIX RTOL ...]
// (PREFIX.K.inputs.ktensors / PREFIX.K.expected.ktensors for K < SETS); the
// first model is the MLP (graphs, threads, speed, shared engines), the last
// the many-engine model (scratch).
int main(int argc, char** argv) {
  et::runtime_init();
  if (argc < 6 || (argc - 2) % 4 != 0) {
    std::fprintf(stderr, "usage: %s SETS NAME PTE PREFIX RTOL [...]\n", argv[0]);
    return 2;
  }
  const int sets = std::atoi(argv[1]);
  std::vector<std::pair<std::string, Case>> cases;
  for (int a = 2; a + 3 < argc; a += 4) {
    Case c;
    if (!read_case(argv[a + 1], argv[a + 2], sets, std::atof(argv[a + 3]), &c)) return 1;
    cases.emplace_back(argv[a], std::move(c));
  }
  check_hashing();
  for (const auto& [name, c] : cases) check_graphs(name, c);
  check_threads(cases.front().first, cases.front().second);
  check_shared_engine_memory(cases.front().first, cases.front().second);
  check_scratch_memory(cases.back().first, cases.back().second);
  for (const auto& [name, c] : cases) check_speed(name, c);
  std::printf("%d failed\n", kiln::gpu_test::failures());
  return kiln::gpu_test::failures() == 0 ? 0 : 1;
}
