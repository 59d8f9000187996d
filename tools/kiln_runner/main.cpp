// kiln_runner: loads a .pte with ExecuTorch's Module (Kiln delegate and CPU
// kernels linked in), feeds it random or given inputs, times execute() and
// checks the outputs against a reference. See README.md.
//
// Exit codes: 0 ok, 1 output mismatch, 2 usage or bad input file,
// 3 the model could not be loaded or run, 4 no green context
// (--green_context_sms / --green_context_sweep).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/platform/runtime.h>

#include "device_io.h"
#include "green_context.h"
#include "gpu_probe.h"
#include "output_report.h"
#include "program_check.h"
#include "runner_flags.h"
#include "kiln/caller_stream.h"
#include "tensor_file.h"
#include "tensor_math.h"
#include "timing.h"

namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::Module;
using kiln::engine::DType;
using kiln::tools::HostTensor;

using kiln::tools::kExitGreenContext;
using kiln::tools::kExitLoad;
using kiln::tools::kExitMismatch;
using kiln::tools::kExitOk;
using kiln::tools::kExitUsage;
using kiln::tools::kUsage;
using kiln::tools::Options;
using kiln::tools::parse_flags;
using kiln::tools::parse_long;
using kiln::tools::usage_error;
using kiln::tools::outputs_match;
using kiln::tools::percentile;
using kiln::tools::tag_name;

constexpr const char* kKilnBackendName = "KilnBackend";

using kiln::tools::to_dtype;
using kiln::tools::to_scalar_type;

std::string error_name(et::Error error) {
  char text[64];
  std::snprintf(text, sizeof(text), "%s (0x%x)", et::to_string(error),
                static_cast<unsigned>(error));
  return text;
}


// ---- KilnBackend load options and counters (--use_cuda_graphs) -------------

// The LoadBackendOptionsMap for Module::load: empty unless --use_cuda_graphs
// was given. `storage` backs the map's span and must outlive the load.
et::LoadBackendOptionsMap kiln_load_options(const Options& options,
                                            et::BackendOptions<1>* storage) {
  et::LoadBackendOptionsMap map;
  if (!options.use_cuda_graphs.empty()) {
    (void)storage->set_option("use_cuda_graphs", options.use_cuda_graphs == "true");
    (void)map.set_options(kKilnBackendName, storage->view());
  }
  return map;
}

// Says plainly why a Kiln model cannot load here, when that is the reason.
void explain_kiln_unavailable(const et::MethodMeta& meta) {
  et::BackendInterface* kiln = et::get_backend_class(kKilnBackendName);
  if (!meta.uses_backend(kKilnBackendName)) return;
  if (kiln == nullptr)
    std::fprintf(stderr,
                 "kiln_runner: the model uses KilnBackend, which is not registered in this "
                 "binary (libexecutorch_backend_kiln.so not linked or not loaded)\n");
  else if (!kiln->is_available()) {
    std::string cause = kiln::tools::describe_missing_gpu();
    if (cause.empty()) cause = "the CUDA runtime sees a GPU, yet the backend does not";
    std::fprintf(stderr,
                 "kiln_runner: this machine has no usable CUDA GPU (%s): the Kiln backend reports "
                 "itself unavailable, so the model's Kiln delegates cannot be initialized\n",
                 cause.c_str());
  }
}

// Builds the method's inputs: from `given` (checked against the method) or
// random. Returns kExitOk or kExitUsage after printing the problem.
int prepare_inputs(const et::MethodMeta& meta, const Options& options,
                   std::vector<HostTensor>* given, std::vector<HostTensor>* inputs) {
  const size_t count = meta.num_inputs();
  if (!options.inputs.empty() && given->size() != count) {
    std::fprintf(stderr, "kiln_runner: %s has %zu tensors but method '%s' takes %zu inputs\n",
                 options.inputs.c_str(), given->size(), options.method.c_str(), count);
    return kExitUsage;
  }
  uint64_t seed = options.seed;
  if (options.inputs.empty()) {
    if (!options.has_seed) seed = std::random_device{}();
    std::printf("random inputs, seed %" PRIu64 " (repeat with --seed=%" PRIu64 ")\n", seed, seed);
  }
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  inputs->resize(count);
  for (size_t i = 0; i < count; ++i) {
    et::Result<et::Tag> tag = meta.input_tag(i);
    if (!tag.ok() || *tag != et::Tag::Tensor) {
      std::fprintf(stderr, "kiln_runner: input %zu of '%s' is %s, not a tensor; kiln_runner "
                   "feeds tensors only\n", i, options.method.c_str(),
                   tag.ok() ? tag_name(*tag).c_str() : "unknown");
      return kExitUsage;
    }
    et::Result<et::TensorInfo> info = meta.input_tensor_meta(i);
    if (!info.ok()) {
      std::fprintf(stderr, "kiln_runner: cannot read input %zu's metadata: %s\n", i,
                   error_name(info.error()).c_str());
      return kExitUsage;
    }
    HostTensor want;
    if (!to_dtype(info->scalar_type(), &want.dtype)) {
      std::fprintf(stderr, "kiln_runner: input %zu has dtype %s, which kiln_runner does not "
                   "handle\n", i, et::toString(info->scalar_type()));
      return kExitUsage;
    }
    for (int32_t d : info->sizes()) want.shape.push_back(d);
    if (options.inputs.empty()) {
      kiln::tools::fill_random(&want, &rng);
      (*inputs)[i] = std::move(want);
      continue;
    }
    HostTensor& have = (*given)[i];
    // A dim up to the planned one is fed as it is (dynamic shapes).
    if (have.dtype != want.dtype ||
        !kiln::tools::fits_planned_shape(have.shape.data(), have.shape.size(), want.shape)) {
      std::fprintf(stderr, "kiln_runner: %s: tensor %zu: method '%s' input %zu is %s, the file "
                   "has %s\n", options.inputs.c_str(), i, options.method.c_str(), i,
                   kiln::tools::describe_tensor(want.dtype, want.shape).c_str(),
                   kiln::tools::describe_tensor(have.dtype, have.shape).c_str());
      return kExitUsage;
    }
    (*inputs)[i] = std::move(have);
  }
  return kExitOk;
}

// ---- green contexts (--green_context_sms, --green_context_sweep) -----------

// warmup + num_runs executions; `sorted_ms` gets the timed latencies, sorted,
// `outputs` the last run's outputs. kExitOk, or kExitLoad after printing why.
int time_executions(const Options& options, Module& module,
                    const std::vector<et::EValue>& input_values, std::vector<double>* sorted_ms,
                    std::vector<et::EValue>* outputs) {
  sorted_ms->clear();
  const long total_runs = options.warmup + options.num_runs;
  for (long r = 0; r < total_runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    auto result = module.execute(options.method, input_values);
    const auto stop = std::chrono::steady_clock::now();
    if (!result.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "kiln_runner: execute failed on run %ld: %s\n", r + 1,
                   error_name(result.error()).c_str());
      return kExitLoad;
    }
    if (r >= options.warmup)
      sorted_ms->push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    *outputs = std::move(*result);
  }
  std::sort(sorted_ms->begin(), sorted_ms->end());
  return kExitOk;
}

// --green_context_sweep: times the method on an ordinary stream, then on a
// green context of each size, and prints one table row per size that could be
// created. 0; 4 when a size could not be created (after the other rows); 1
// when outputs did not match --expected; 3 when an execution failed.
int run_green_context_sweep(const Options& options, Module& module,
                            const std::vector<et::EValue>& input_values,
                            const std::vector<HostTensor>& expected) {
  const bool check = !options.expected.empty();
  std::vector<double> ms;
  std::vector<et::EValue> outputs;
  if (int code = time_executions(options, module, input_values, &ms, &outputs); code != kExitOk)
    return code;
  bool mismatch = check && !outputs_match(options, outputs, expected);
  std::printf("ordinary stream (no green context): median %.3f ms, p90 %.3f ms%s\n",
              percentile(ms, 0.5), percentile(ms, 0.9),
              !check ? "" : mismatch ? ", outputs FAIL" : ", outputs PASS");
  std::printf("%ld warmup + %ld timed runs per size\n\n", options.warmup, options.num_runs);
  std::printf("SMs requested | SMs obtained | median ms |   p90 ms%s\n", check ? " | outputs" : "");
  std::printf("--------------+--------------+-----------+---------%s\n", check ? "+--------" : "");
  std::vector<unsigned> failed;
  for (unsigned sms : options.green_context_sweep_sms) {
    std::unique_ptr<kiln::tools::GreenContext> green;
    if (std::string problem = kiln::tools::GreenContext::create(sms, &green); !problem.empty()) {
      std::fflush(stdout);
      std::fprintf(stderr, "kiln_runner: no green context of %u SMs: %s\n", sms,
                   problem.c_str());
      failed.push_back(sms);
      continue;
    }
    int code;
    {
      kiln::CallerStreamGuard guard(green->stream());
      code = time_executions(options, module, input_values, &ms, &outputs);
    }
    if (code != kExitOk) return code;
    const bool ok = !check || outputs_match(options, outputs, expected);
    mismatch |= !ok;
    std::printf("%13u | %12u | %9.3f | %8.3f%s\n", sms, green->obtained_sms(),
                percentile(ms, 0.5), percentile(ms, 0.9),
                !check ? "" : ok ? " | PASS" : " | FAIL");
    std::fflush(stdout);
    if (std::string problem = green->destroy(); !problem.empty())
      std::fprintf(stderr, "kiln_runner: warning: destroying the %u-SM green context: %s\n",
                   sms, problem.c_str());
  }
  if (!failed.empty()) {
    std::string list;
    for (unsigned sms : failed) list += (list.empty() ? "" : ", ") + std::to_string(sms);
    std::fprintf(stderr, "kiln_runner: %zu of %zu green context sizes could not be created "
                 "(%s SMs)\n", failed.size(), options.green_context_sweep_sms.size(),
                 list.c_str());
    return kExitGreenContext;
  }
  return mismatch ? kExitMismatch : kExitOk;
}

int run(const Options& options) {
  if (std::FILE* f = std::fopen(options.model_path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    std::fprintf(stderr, "kiln_runner: cannot open model file '%s': %s\n",
                 options.model_path.c_str(), std::strerror(errno));
    return kExitUsage;
  }
  if (!options.data_path.empty()) {
    if (std::FILE* f = std::fopen(options.data_path.c_str(), "rb")) {
      std::fclose(f);
    } else {
      std::fprintf(stderr, "kiln_runner: cannot open data file '%s': %s\n",
                   options.data_path.c_str(), std::strerror(errno));
      return kExitUsage;
    }
  }
  // Read the tensor files first: a bad file should not wait for model loading.
  std::vector<HostTensor> given, expected;
  for (const auto& [path, tensors] :
       {std::make_pair(&options.inputs, &given), std::make_pair(&options.expected, &expected)}) {
    if (path->empty()) continue;
    kiln::Result<std::vector<HostTensor>> read = kiln::tools::read_tensor_file(*path);
    if (!read.is_ok()) {
      std::fprintf(stderr, "kiln_runner: %s\n", read.status().message().c_str());
      return kExitUsage;
    }
    *tensors = std::move(read).value();
  }

  et::BackendInterface* kiln = et::get_backend_class(kKilnBackendName);
  std::printf("KilnBackend: %s\n", kiln == nullptr ? "NOT registered"
                                   : kiln->is_available() ? "registered, CUDA GPU available"
                                                          : "registered, no usable CUDA GPU");

  kiln::tools::TimingReport report;  // --timing_json
  report.model_path = options.model_path;
  report.method = options.method;
  report.timer = options.cuda_events ? "cuda_events" : "wall";
  report.use_cuda_graphs = options.use_cuda_graphs;
  report.device_io = options.device_io;
  report.warmup = options.warmup;
  report.memory_known = !options.timing_json.empty() &&
                        kiln::tools::device_memory_used(&report.memory_before_load);
  const auto load_start = std::chrono::steady_clock::now();
  if (std::string why = kiln::tools::check_delegate_tables_in_file(options.model_path);
      !why.empty()) {
    std::fprintf(stderr, "kiln_runner: cannot load program '%s': %s\n",
                 options.model_path.c_str(), why.c_str());
    return kExitLoad;
  }
  // With --data_path the program's external named data (the weights of a
  // .pte saved with external_weights) comes from that .ptd.
  Module module = options.data_path.empty()
                      ? Module(options.model_path, Module::LoadMode::Mmap)
                      : Module(options.model_path, options.data_path, Module::LoadMode::Mmap);
  et::BackendOptions<1> load_option_storage;
  // Whole-program verification (program_check.h): a damaged file fails here.
  et::Error error = module.load(kiln_load_options(options, &load_option_storage),
                                kiln::tools::kProgramVerification);
  if (error != et::Error::Ok) {
    std::fprintf(stderr, "kiln_runner: cannot load program '%s': %s\n",
                 options.model_path.c_str(), error_name(error).c_str());
    return kExitLoad;
  }
  auto names = module.method_names();
  if (names.ok() && names->count(options.method) == 0) {
    std::string list;
    for (const auto& name : *names) list += (list.empty() ? "" : ", ") + name;
    std::fprintf(stderr, "kiln_runner: the model has no method '%s' (it has: %s)\n",
                 options.method.c_str(), list.c_str());
    return kExitUsage;
  }
  et::Result<et::MethodMeta> meta = module.method_meta(options.method);
  if (!meta.ok()) {
    std::fprintf(stderr, "kiln_runner: cannot read method '%s': %s\n", options.method.c_str(),
                 error_name(meta.error()).c_str());
    return kExitLoad;
  }
  std::string backends;
  for (size_t i = 0; i < meta->num_backends(); ++i) {
    et::Result<const char*> name = meta->get_backend_name(i);
    backends += (i == 0 ? "" : ", ") + std::string(name.ok() ? *name : "?");
  }
  std::printf("method '%s': %zu inputs, %zu outputs, delegates: %s\n", options.method.c_str(),
              meta->num_inputs(), meta->num_outputs(), backends.empty() ? "none" : backends.c_str());

  if (std::string why = kiln::tools::check_planned_memory(*meta, kiln::tools::physical_memory_bytes());
      !why.empty()) {
    std::fprintf(stderr, "kiln_runner: cannot load method '%s': %s\n", options.method.c_str(),
                 why.c_str());
    return kExitLoad;
  }
  error = module.load_method(options.method, nullptr, nullptr, &module.backend_options());
  if (error != et::Error::Ok) {
    std::fprintf(stderr, "kiln_runner: cannot load method '%s': %s\n", options.method.c_str(),
                 error_name(error).c_str());
    explain_kiln_unavailable(*meta);
    return kExitLoad;
  }
  report.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start)
          .count();
  report.delegates = backends;

  std::vector<HostTensor> inputs;
  if (int code = prepare_inputs(*meta, options, &given, &inputs); code != kExitOk) return code;
  std::vector<executorch::extension::TensorPtr> input_tensors;
  std::vector<et::EValue> input_values;
  kiln::tools::DeviceIo device_io;  // --device_io: inputs/outputs in CUDA memory
  if (options.device_io) {
    std::string why = device_io.prepare(module, options.method, inputs);
    if (!why.empty()) {
      std::fprintf(stderr, "kiln_runner: --device_io: %s\n", why.c_str());
      return kExitLoad;
    }
    input_values = device_io.input_values();
  }
  for (HostTensor& t : inputs) {
    if (options.device_io) break;
    std::vector<executorch::aten::SizesType> sizes(t.shape.begin(), t.shape.end());
    input_tensors.push_back(executorch::extension::from_blob(t.data.data(), std::move(sizes),
                                                             to_scalar_type(t.dtype)));
    input_values.emplace_back(*input_tensors.back());
  }
  if (!options.green_context_sweep.empty())
    return run_green_context_sweep(options, module, input_values, expected);
  std::unique_ptr<kiln::CallerStreamGuard> green_guard;  // executions on the green context
  if (options.green_context != nullptr)
    green_guard = std::make_unique<kiln::CallerStreamGuard>(options.green_context->stream());

  // Host I/O: execute() returns when the outputs are in host memory (the Kiln
  // delegate synchronizes). Device I/O: RunTimer waits for the GPU.
  kiln::tools::RunTimer timer(options.cuda_events);
  if (std::string why = timer.init(); !why.empty()) {
    std::fprintf(stderr, "kiln_runner: --cuda_events: %s\n", why.c_str());
    return kExitLoad;
  }
  std::vector<double> sorted;
  std::vector<et::EValue> outputs;
  const long total_runs = options.warmup + options.num_runs;
  for (long r = 0; r < total_runs; ++r) {
    if (r == options.warmup && report.memory_known)
      (void)kiln::tools::device_memory_used(&report.memory_after_warmup);
    timer.start();
    auto result = module.execute(options.method, input_values);
    std::string timer_error;
    const double ms = timer.stop(options.device_io, &timer_error);
    if (!result.ok() || ms < 0.0) {
      std::fprintf(stderr, "kiln_runner: execute failed on run %ld: %s\n", r + 1,
                   result.ok() ? timer_error.c_str() : error_name(result.error()).c_str());
      return kExitLoad;
    }
    if (r >= options.warmup) sorted.push_back(ms);
    outputs = std::move(*result);
  }
  std::sort(sorted.begin(), sorted.end());
  std::printf("latency over %zu runs (%s): median %.3f ms, p10 %.3f ms, p90 %.3f ms, min %.3f "
              "ms, max %.3f ms\n", sorted.size(), report.timer.c_str(), percentile(sorted, 0.5),
              percentile(sorted, 0.1), percentile(sorted, 0.9), sorted.front(), sorted.back());
  report.counters = kiln::tools::read_kiln_counters();
  kiln::tools::print_kiln_counters(report.counters);
  if (!options.timing_json.empty()) {
    report.sorted_ms = sorted;
    if (std::string why = kiln::tools::write_timing_json(options.timing_json, report);
        !why.empty()) {
      std::fprintf(stderr, "kiln_runner: %s\n", why.c_str());
      return kExitUsage;
    }
    std::printf("timing written to %s\n", options.timing_json.c_str());
  }

  return kiln::tools::report_outputs(options, outputs, expected);
}

// The 'all' ladder of --green_context_sweep: the smallest partition, doubling,
// then the whole device (rounded down to the alignment).
std::vector<unsigned> green_context_ladder(const kiln::tools::DeviceSmInfo& info) {
  const unsigned align = std::max(info.alignment, 1u);
  const unsigned top = std::max(info.sm_count / align * align, 1u);
  std::vector<unsigned> ladder;
  for (unsigned sms = std::max(info.min_partition, 1u); sms < top; sms *= 2) ladder.push_back(sms);
  ladder.push_back(top);
  return ladder;
}

// --green_context_sms=N / --green_context_sweep: checks that green contexts
// can be made here before the model is loaded (exit 4 with the reason if not),
// then runs with the green context's stream (or the sweep) via run().
int run_green_context_modes(Options options) {
  kiln::tools::DeviceSmInfo info;
  if (std::string problem = kiln::tools::query_device_sms(&info); !problem.empty()) {
    std::fprintf(stderr, "kiln_runner: cannot create a CUDA green context: %s\n",
                 problem.c_str());
    return kExitGreenContext;
  }
  const std::string device = "device " + std::to_string(info.ordinal) + " (" + info.name +
                             "): " + std::to_string(info.sm_count) + " SMs, green contexts of " +
                             std::to_string(info.min_partition) + " SMs or more in steps of " +
                             std::to_string(info.alignment);
  if (!options.green_context_sweep.empty()) {
    if (options.green_context_sweep == "all")
      options.green_context_sweep_sms = green_context_ladder(info);
    std::printf("green context sweep on %s\n", device.c_str());
    return run(options);
  }
  std::unique_ptr<kiln::tools::GreenContext> green;
  if (std::string problem = kiln::tools::GreenContext::create(
          static_cast<unsigned>(options.green_context_sms), &green);
      !problem.empty()) {
    std::fprintf(stderr, "kiln_runner: cannot create a green context of %ld SMs: %s\n",
                 options.green_context_sms, problem.c_str());
    return kExitGreenContext;
  }
  std::printf("green context: %ld SMs requested, %u SMs obtained, on %s\n",
              options.green_context_sms, green->obtained_sms(), device.c_str());
  options.green_context = green.get();
  const int code = run(options);
  if (std::string problem = green->destroy(); !problem.empty())
    std::fprintf(stderr, "kiln_runner: warning: destroying the green context: %s\n",
                 problem.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::runtime_init();
  Options options;
  const std::string problem = parse_flags(argc, argv, &options);
  if (!problem.empty()) return usage_error(problem);
  if (options.help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (options.model_path.empty()) return usage_error("--model_path is required");
  if (options.green_context_sms > 0 && !options.green_context_sweep.empty())
    return usage_error("--green_context_sms and --green_context_sweep cannot be combined");
  if (options.green_context_sms > 0 || !options.green_context_sweep.empty())
    return run_green_context_modes(options);
  return run(options);
}
