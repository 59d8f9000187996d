// GPU test of engine-owned mutable state (a KV cache updated in place), run on
// the GPU machine by scripts/gpu_check.sh (when $bundle/state is carried) on the files of
// tests/gpu/export_state_test.py: the steps run in order through one Module,
// each against PyTorch's output for the same step. Each output reads the
// whole cache, so a state that is lost, copied instead of updated, or
// updated at the wrong slot fails the steps after it. Then a second Module of
// the same file (same state scope) must see the same cache: its first step
// repeats the last one and must match it. Prints PASS/FAIL lines; exit 1 if
// any failed.
//
//   kiln_state_test <files dir> <steps> <rtol>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/platform/runtime.h>

#include "gpu_test_util.h"
#include "tensor_file.h"
#include "tensor_math.h"

namespace {

namespace et = executorch::runtime;
using executorch::extension::Module;
using kiln::tools::HostTensor;

using kiln::gpu_test::report;

// `pte`'s forward loaded with the KilnBackend load option state_scope=`scope`; nullptr when
// the load fails.
std::unique_ptr<Module> load_in_scope(const std::string& pte, const char* scope) {
  auto module = std::make_unique<Module>(pte, Module::LoadMode::Mmap);
  et::BackendOptions<1> opts;
  et::LoadBackendOptionsMap map;
  if (opts.set_option("state_scope", scope) != et::Error::Ok ||
      map.set_options("KilnBackend", opts.view()) != et::Error::Ok || module->load(map) != et::Error::Ok ||
      module->load_method("forward", nullptr, nullptr, &module->backend_options()) != et::Error::Ok)
    return nullptr;
  return module;
}

// Runs `module`'s forward on host tensors.
et::Result<std::vector<et::EValue>> execute(Module& module, std::vector<HostTensor>& inputs) {
  std::vector<executorch::extension::TensorPtr> keep;
  std::vector<et::EValue> args;
  for (HostTensor& h : inputs) {
    std::vector<executorch::aten::SizesType> sizes(h.shape.begin(), h.shape.end());
    keep.push_back(executorch::extension::from_blob(h.data.data(), sizes, kiln::gpu_test::scalar_type(h.dtype)));
    args.emplace_back(*keep.back());
  }
  return module.execute("forward", args);
}

// Runs step `t` of `dir` through `module`; its rel_err against PyTorch, or -1.
double run_step(Module& module, const std::string& dir, int t) {
  auto in = kiln::tools::read_tensor_file(dir + "/step_" + std::to_string(t) + ".inputs.ktensors");
  auto ex = kiln::tools::read_tensor_file(dir + "/step_" + std::to_string(t) + ".expected.ktensors");
  if (!in.is_ok() || !ex.is_ok() || ex.value().size() != 1) return -1;
  std::vector<HostTensor> inputs = in.value();
  auto result = execute(module, inputs);
  if (!result.ok() || result->empty() || !(*result)[0].isTensor()) return -1;
  const auto& out = (*result)[0].toTensor();
  const HostTensor got = kiln::gpu_test::to_host(out, ex.value()[0].dtype);
  if (got.shape != ex.value()[0].shape) return -1;
  const kiln::tools::Comparison cmp = kiln::tools::compare_tensors(got, ex.value()[0]);
  return cmp.non_finite == 0 ? cmp.rel_err : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: kiln_state_test <files dir> <steps> <rtol>\n");
    return 2;
  }
  et::runtime_init();
  const std::string dir = argv[1];
  const int steps = std::atoi(argv[2]);
  const double rtol = std::atof(argv[3]);
  Module module(dir + "/decoder.pte", Module::LoadMode::Mmap);
  if (module.load_method("forward") != et::Error::Ok) {
    report(false, "load decoder.pte");
    return 1;
  }
  double worst = 0;
  bool ok = true;
  for (int t = 0; t < steps; ++t) {
    const double e = run_step(module, dir, t);
    if (e < 0 || e > rtol) {
      std::printf("INFO  step %d: rel_err %.2e\n", t, e);
      ok = false;
    }
    worst = std::max(worst, e);
  }
  char line[256];
  std::snprintf(line, sizeof(line),
                "%d decode steps through one module match PyTorch with the cache kept on the GPU and "
                "updated in place (worst rel_err %.2e, rtol %.0e)", steps, worst, rtol);
  report(ok, line);
  // A second module of the same file shares the cache (one state scope): its
  // first run of the last step writes the same slot with the same values, so
  // it sees exactly the cache the first module left.
  Module second(dir + "/decoder.pte", Module::LoadMode::Mmap);
  const double again = second.load_method("forward") == et::Error::Ok ? run_step(second, dir, steps - 1) : -1;
  std::snprintf(line, sizeof(line), "a second module of the file sees the same cache (rel_err %.2e)", again);
  report(again >= 0 && again <= rtol, line);

  // A position past the cache (32 slots) is refused before any launch (the index input's bound,
  // engine_format/input_bounds.h), and the cache is left as it was: the last step again matches.
  {
    auto in = kiln::tools::read_tensor_file(dir + "/step_0.inputs.ktensors");
    bool refused = false;
    if (in.is_ok() && in.value().size() == 2) {
      std::vector<HostTensor> inputs = in.value();
      const int64_t bad = 32;
      std::memcpy(inputs[1].data.data(), &bad, sizeof bad);
      refused = execute(module, inputs).error() == et::Error::InvalidArgument;
    }
    const double after = run_step(module, dir, steps - 1);
    std::snprintf(line, sizeof(line),
                  "position 32 of a 32-slot cache is refused with InvalidArgument, the cache untouched (rel_err %.2e "
                  "after)", after);
    report(refused && after >= 0 && after <= rtol, line);
  }

  // Another state scope: a cache of its own, from zeros.
  std::unique_ptr<Module> isolated = load_in_scope(dir + "/decoder.pte", "isolated");
  const double e0 = isolated ? run_step(*isolated, dir, 0) : -1;
  const double e1 = isolated ? run_step(*isolated, dir, 1) : -1;
  std::snprintf(line, sizeof(line),
                "a module loaded with state_scope \"isolated\" starts from its own empty cache (steps 0 "
                "and 1: rel_err %.2e, %.2e)", e0, e1);
  report(e0 >= 0 && e0 <= rtol && e1 >= 0 && e1 <= rtol, line);
  std::unique_ptr<Module> isolated2 = load_in_scope(dir + "/decoder.pte", "isolated");
  const double e1_again = isolated2 ? run_step(*isolated2, dir, 1) : -1;
  std::snprintf(line, sizeof(line), "a second module in scope \"isolated\" shares that cache (rel_err %.2e)",
                e1_again);
  report(e1_again >= 0 && e1_again <= rtol, line);
  const double first_again = run_step(module, dir, steps - 1);
  std::snprintf(line, sizeof(line),
                "the default scope's cache is untouched by the isolated scope's writes (rel_err %.2e)",
                first_again);
  report(first_again >= 0 && first_again <= rtol, line);
  return kiln::gpu_test::failures() == 0 ? 0 : 1;
}
