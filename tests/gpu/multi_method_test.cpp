// GPU test of several methods in one .pte with their weights stored and
// loaded once, run on the GPU machine by tests/gpu/multi_method_test.py, which
// exports nothing: the .pte/.ptd files come from tests/gpu/export_multi_method.py
// (CPU machine) and the driver writes fresh random inputs and PyTorch's
// outputs (.ktensors) for each model and method. Checks, one line each:
//   - model A's "prefill" and "decode" match PyTorch; loading both methods
//     uploads each named weight once (decode reuses prefill's device copies)
//   - model B (same architecture, state-dict names and model id, other bytes)
//     uploads its own weights, matches PyTorch, and A still matches after it
//   - A saved with its weights in a .ptd shares A's device copies (no upload)
//     and matches; without its .ptd, or with B's, it is refused at load
//   - when every module using A's weights is gone they are freed: loading A
//     again uploads again
// Prints PASS/FAIL lines and exits 1 if any failed.
//
//   kiln_multi_method_test <files dir> <work dir> <keys of A> <keys of B> <rtol> <sets>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/runtime.h>

#include "gpu_test_util.h"
#include "tensor_file.h"
#include "tensor_math.h"

namespace {

namespace et = executorch::runtime;
using executorch::extension::Module;
using kiln::tools::HostTensor;

using kiln::gpu_test::report;

struct Counters {
  int uploads = -1, reuses = -1;
};

Counters counters() {
  et::BackendOptions<2> q;
  (void)q.set_option("named_weight_uploads", 0);
  (void)q.set_option("named_weight_reuses", 0);
  Counters c;
  if (et::get_option("KilnBackend", q.view()) != et::Error::Ok) return c;
  const int* up = std::get_if<int>(&q.view()[0].value);
  const int* re = std::get_if<int>(&q.view()[1].value);
  c.uploads = up != nullptr ? *up : -1;
  c.reuses = re != nullptr ? *re : -1;
  return c;
}

const char* kMethods[] = {"prefill", "decode"};

// Loads `pte` (with `ptd` when not empty) and both methods; nullptr when any
// step fails (`quiet`: the caller expects that).
std::unique_ptr<Module> load(const std::string& pte, const std::string& ptd, bool quiet = false) {
  auto module = ptd.empty() ? std::make_unique<Module>(pte, Module::LoadMode::Mmap)
                            : std::make_unique<Module>(pte, ptd, Module::LoadMode::Mmap);
  if (module->load(et::Program::Verification::InternalConsistency) != et::Error::Ok) {
    if (!quiet) report(false, "load " + pte);
    return nullptr;
  }
  for (const char* method : kMethods) {
    if (module->load_method(method) != et::Error::Ok) {
      if (!quiet) report(false, std::string("load_method ") + method + " of " + pte);
      return nullptr;
    }
  }
  return module;
}

struct Data {
  // [method][set]
  std::vector<std::vector<HostTensor>> inputs, expected;
};

bool read_data(const std::string& work, const std::string& model, int sets, Data* d) {
  d->inputs.assign(2, {});
  d->expected.assign(2, {});
  for (int m = 0; m < 2; ++m)
    for (int k = 0; k < sets; ++k) {
      const std::string prefix = work + "/" + model + "." + kMethods[m] + "." + std::to_string(k);
      auto in = kiln::tools::read_tensor_file(prefix + ".inputs.ktensors");
      auto ex = kiln::tools::read_tensor_file(prefix + ".expected.ktensors");
      if (!in.is_ok() || !ex.is_ok() || in.value().size() != 1 || ex.value().size() != 1) {
        report(false, "read " + prefix + ".*.ktensors");
        return false;
      }
      d->inputs[m].push_back(in.value()[0]);
      d->expected[m].push_back(ex.value()[0]);
    }
  return true;
}

// Runs every set of both methods; true when all match within `rtol`.
bool run_all(Module& module, const Data& d, double rtol, double* worst) {
  bool ok = true;
  *worst = 0;
  for (int m = 0; m < 2; ++m)
    for (size_t k = 0; k < d.inputs[m].size(); ++k) {
      HostTensor in = d.inputs[m][k];  // from_blob wants mutable data
      std::vector<executorch::aten::SizesType> sizes(in.shape.begin(), in.shape.end());
      auto t = executorch::extension::from_blob(in.data.data(), sizes,
                                                executorch::aten::ScalarType::Float);
      auto result = module.execute(kMethods[m], std::vector<et::EValue>{et::EValue(*t)});
      if (!result.ok() || result->empty() || !(*result)[0].isTensor()) {
        std::printf("INFO  %s set %zu: execute failed\n", kMethods[m], k);
        ok = false;
        continue;
      }
      const auto& out = (*result)[0].toTensor();
      const HostTensor got = kiln::gpu_test::to_host(out, d.expected[m][k].dtype);
      if (got.shape != d.expected[m][k].shape) {
        ok = false;
        continue;
      }
      const kiln::tools::Comparison cmp = kiln::tools::compare_tensors(got, d.expected[m][k]);
      *worst = std::max(*worst, cmp.rel_err);
      ok &= cmp.non_finite == 0 && cmp.rel_err <= rtol;
    }
  return ok;
}

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s <files dir> <work dir> <keys of A> <keys of B> <rtol> <sets>\n",
                 argv[0]);
    return 2;
  }
  et::runtime_init();
  const std::string dir = argv[1], work = argv[2];
  const int keys_a = std::atoi(argv[3]), keys_b = std::atoi(argv[4]);
  const double rtol = std::atof(argv[5]);
  const int sets = std::atoi(argv[6]);
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("SKIP  no CUDA GPU\n");
    return 0;
  }
  Data data_a, data_b;
  if (!read_data(work, "a", sets, &data_a) || !read_data(work, "b", sets, &data_b)) return 1;

  const Counters c0 = counters();
  auto a = load(dir + "/a.pte", "");
  if (!a) return 1;
  const Counters c1 = counters();
  report(c1.uploads - c0.uploads == keys_a && c1.reuses - c0.reuses == keys_a,
         fmt("A: prefill + decode loaded from one .pte: %d named weights uploaded, %d reused "
             "(expected %d and %d: decode shares prefill's device copies)",
             c1.uploads - c0.uploads, c1.reuses - c0.reuses, keys_a, keys_a));
  double worst = 0;
  report(run_all(*a, data_a, rtol, &worst),
         fmt("A: prefill and decode match PyTorch on fresh inputs (%d sets each, worst rel_err "
             "%.2e, rtol %.0e)", sets, worst, rtol));

  auto b = load(dir + "/b.pte", "");
  if (!b) return 1;
  const Counters c2 = counters();
  report(c2.uploads - c1.uploads == keys_b && c2.reuses - c1.reuses == keys_b,
         fmt("B (same names and model id, other weights): %d uploaded, %d reused (expected %d "
             "and %d: nothing taken from A)",
             c2.uploads - c1.uploads, c2.reuses - c1.reuses, keys_b, keys_b));
  report(run_all(*b, data_b, rtol, &worst),
         fmt("B: prefill and decode match PyTorch (worst rel_err %.2e)", worst));
  report(run_all(*a, data_a, rtol, &worst),
         fmt("A still matches PyTorch with B loaded in the same process (worst rel_err %.2e)",
             worst));

  auto a_ext = load(dir + "/a_ext.pte", dir + "/a_ext.ptd");
  if (!a_ext) return 1;
  const Counters c3 = counters();
  report(c3.uploads == c2.uploads && c3.reuses - c2.reuses == 2 * keys_a,
         fmt("A from .pte + .ptd: %d uploaded, %d reused (expected 0 and %d: A's device copies "
             "shared across files)",
             c3.uploads - c2.uploads, c3.reuses - c2.reuses, 2 * keys_a));
  report(run_all(*a_ext, data_a, rtol, &worst),
         fmt("A from .pte + .ptd matches PyTorch (worst rel_err %.2e)", worst));

  std::printf("INFO  next: two loads that must fail (their ExecuTorch/Kiln error lines follow)\n");
  std::fflush(stdout);
  report(load(dir + "/a_ext.pte", "", true) == nullptr,
         "A's external-weights .pte without its .ptd is refused at load");
  report(load(dir + "/a_ext.pte", dir + "/b_ext.ptd", true) == nullptr,
         "A's external-weights .pte with B's .ptd is refused at load");

  a.reset();
  a_ext.reset();
  const Counters c4 = counters();
  auto again = load(dir + "/a.pte", "");
  if (!again) return 1;
  const Counters c5 = counters();
  report(c5.uploads - c4.uploads == keys_a && c5.reuses - c4.reuses == keys_a,
         fmt("A's weights were freed with the last module using them: loading A again uploaded "
             "%d, reused %d (expected %d and %d)",
             c5.uploads - c4.uploads, c5.reuses - c4.reuses, keys_a, keys_a));
  report(run_all(*again, data_a, rtol, &worst) && run_all(*b, data_b, rtol, &worst),
         "A reloaded and B both still match PyTorch");
  std::printf("%s: %d check(s) failed\n", kiln::gpu_test::failures() ? "FAIL" : "PASS", kiln::gpu_test::failures());
  return kiln::gpu_test::failures() ? 1 : 0;
}
