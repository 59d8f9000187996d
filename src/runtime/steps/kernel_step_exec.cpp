// Generated-kernel steps, run side: at load, every kernel module is loaded
// (the cubin for this SM or an older minor of its major, else PTX) and every
// kernel step's function resolved and checked against the GPU; per context,
// each step's parameter array is built once and launched with
// cudaLaunchKernel, or, for the sm_90+ cubins of an engine built with
// overlap_launches, cudaLaunchKernelExC with the programmatic-serialization
// attribute: such a kernel waits for its predecessor in-kernel
// (codegen/grid_dependency.h), so it may launch while that one runs. A
// persistent step (KernelStep::min_blocks > 0) gets its grid at load: the
// largest co-resident block count (a whole number of the kernel's clusters)
// up to grid[0]; it always launches the classic way. The format half is
// engine_format/steps/kernel_step_format.cpp.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda_check.h"
#include "runtime/engine.h"
#include "runtime/log.h"
#include "runtime/step_runtime.h"
#include "runtime/steps/kernel_code_choice.h"
#include "runtime/steps/kernel_step_exec.h"

namespace kiln::runtime {
namespace {

using engine::KernelArgKind;
using engine::KernelModule;
using engine::StepKind;

size_t kernel_arg_bytes(KernelArgKind kind) {
  switch (kind) {
    case KernelArgKind::kTensor:
      return sizeof(void*);
    case KernelArgKind::kInt64:
      return sizeof(int64_t);
    case KernelArgKind::kFloat32:
      return sizeof(float);
  }
  return 0;
}

const char* kernel_arg_name(KernelArgKind kind) {
  switch (kind) {
    case KernelArgKind::kTensor:
      return "pointer";
    case KernelArgKind::kInt64:
      return "int64";
    case KernelArgKind::kFloat32:
      return "float32";
  }
  return "?";
}

// A kernel step resolved at load: the handle stays valid for the Engine's life.
struct KernelPlan {
  cudaKernel_t kernel = nullptr;
  dim3 grid;
  dim3 block;
  uint32_t shared_bytes = 0;  // dynamic shared memory
  bool programmatic = false;  // launched with programmatic stream serialization
};

// One kernel parameter, passed by value from here.
union ArgSlot {
  void* ptr;
  int64_t i64;
  float f32;
};

class KernelExecutor : public StepExecutor {
 public:
  KernelExecutor(const KernelPlan& plan, size_t args)
      : plan_(plan), slots_(args, ArgSlot{nullptr}), pointers_(args, nullptr) {
    for (size_t j = 0; j < args; ++j) pointers_[j] = &slots_[j];
  }
  // Sized once in the constructor: the bindings point into slots_.
  ArgSlot& slot(size_t j) { return slots_[j]; }

  Status run(cudaStream_t stream) override {
    if (plan_.programmatic) {
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attribute.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = plan_.grid;
      config.blockDim = plan_.block;
      config.dynamicSmemBytes = plan_.shared_bytes;
      config.stream = stream;
      config.attrs = &attribute;
      config.numAttrs = 1;
      KILN_CUDA_RETURN_IF_ERROR(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(plan_.kernel),
                                                    pointers_.empty() ? nullptr : pointers_.data()));
      KILN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return Status::ok();
    }
    KILN_CUDA_RETURN_IF_ERROR(cudaLaunchKernel(reinterpret_cast<const void*>(plan_.kernel),
                                               plan_.grid, plan_.block,
                                               pointers_.empty() ? nullptr : pointers_.data(),
                                               plan_.shared_bytes, stream));
    KILN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
  }

 private:
  const KernelPlan& plan_;
  std::vector<ArgSlot> slots_;
  std::vector<void*> pointers_;  // pointers_[j] == &slots_[j]
};

class KernelPlans;

class KernelContext : public StepKindContext {
 public:
  KernelContext(const KernelPlans& plans, const Engine& engine) : plans_(plans), engine_(engine) {}
  Result<std::unique_ptr<StepExecutor>> make_executor(size_t step, StepBinder& binder) override;
  Status check_stream(cudaStream_t stream) override { return check_persistent_grids(engine_, stream); }

 private:
  const KernelPlans& plans_;
  const Engine& engine_;
};

class KernelPlans : public StepKindPlans {
 public:
  ~KernelPlans() override {
    for (cudaLibrary_t lib : libraries) (void)cudaLibraryUnload(lib);
    (void)cudaGetLastError();
  }
  Result<std::unique_ptr<StepKindContext>> create_context(const Engine& engine) const override {
    return Result<std::unique_ptr<StepKindContext>>(
        std::make_unique<KernelContext>(*this, engine));
  }

  std::vector<cudaLibrary_t> libraries;  // one per module
  std::vector<bool> programmatic;        // per module: its kernels launch programmatically
  std::vector<KernelPlan> plans;         // per step (kernel steps only)
};

Result<std::unique_ptr<StepExecutor>> KernelContext::make_executor(size_t step,
                                                                   StepBinder& binder) {
  const engine::KernelStep& ks = engine_.desc().steps[step].kernel;
  auto executor = std::make_unique<KernelExecutor>(plans_.plans[step], ks.args.size());
  for (size_t j = 0; j < ks.args.size(); ++j) {
    const engine::KernelArg& arg = ks.args[j];
    ArgSlot& slot = executor->slot(j);
    switch (arg.kind) {
      case KernelArgKind::kTensor:
        binder.bind(arg.tensor, &slot.ptr);
        break;
      case KernelArgKind::kInt64:
        slot.i64 = arg.i64;
        break;
      case KernelArgKind::kFloat32:
        slot.f32 = arg.f32;
        break;
    }
  }
  return Result<std::unique_ptr<StepExecutor>>(std::move(executor));
}

Status load_modules(const engine::EngineDesc& desc, const DeviceInfo& device, KernelPlans* out) {
  const uint32_t sm = static_cast<uint32_t>(device.sm);
  const std::string* overlap_value = desc.find_metadata("overlap_launches");
  const bool overlap = overlap_value != nullptr && *overlap_value == "true";
  out->libraries.reserve(desc.modules.size());
  for (const KernelModule& m : desc.modules) {
    Result<KernelCode> chosen = choose_kernel_code(m, sm);
    if (!chosen.is_ok()) return chosen.status();
    const void* image = chosen->image;
    const bool from_ptx = chosen->from_ptx;
    const std::string& which = chosen->which;
    if (from_ptx) {
      // Once per module and load (a shared engine loads once per GPU): the
      // JIT costs load time, and says the engine was not built for this GPU.
      log_message(LogLevel::kInfo,
                  "engine module '%s' has no cubin for this GPU (sm_%u; it carries %s): JIT-compiling its PTX "
                  "(compute_%u) with the driver; export with target_sms including %u to skip this",
                  m.name.c_str(), sm, describe_kernel_code(m).c_str(), m.ptx_sm, sm);
    }

    // The JIT's error log says why PTX failed to compile; keep it for the message.
    // Only passed for PTX: a cubin involves no compiler.
    char error_log[2048] = {0};
    cudaJitOption options[] = {cudaJitErrorLogBuffer, cudaJitErrorLogBufferSizeBytes};
    void* option_values[] = {error_log,
                             reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(error_log)))};
    cudaLibrary_t library = nullptr;
    cudaError_t error =
        cudaLibraryLoadData(&library, image, from_ptx ? options : nullptr,
                            from_ptx ? option_values : nullptr, from_ptx ? 2 : 0, nullptr,
                            nullptr, 0);
    if (error != cudaSuccess) {
      error_log[sizeof(error_log) - 1] = '\0';
      Status status = cuda_error_status(error, "cudaLibraryLoadData", __FILE__, __LINE__);
      std::string context = "loading engine module '" + m.name + "' (" + which + ")";
      if (error_log[0] != '\0') context += " [JIT log: " + std::string(error_log) + "]";
      return status.with_context(context);
    }
    out->libraries.push_back(library);
    // Only a cubin built with griddepcontrol waits for its predecessor; the
    // PTX (compute_80) never has it, and launching a kernel that does not
    // wait programmatically would race.
    out->programmatic.push_back(overlap && !from_ptx && chosen->arch >= 90 && device.sm >= 90);
  }
  return Status::ok();
}

// A persistent kernel's blocks wait on each other through global memory, so
// every block must be resident at once or the kernel never finishes: its grid
// is the largest count <= grid[0] that fits on this GPU together (occupancy
// with the step's block and dynamic shared memory, after the kernel's opt-in)
// and is a whole number of the kernel's compiled clusters (__cluster_dims__).
// Fewer than min_blocks: kIncompatible.
Status choose_persistent_grid(const engine::EngineDesc& desc, size_t step, const DeviceInfo& device,
                              KernelPlan* plan) {
  const engine::KernelStep& ks = desc.steps[step].kernel;
  const std::string where = step_label(desc, step) + ": kernel '" + ks.function + "' in module '" +
                            desc.modules[ks.module].name + "'";
  const void* func = reinterpret_cast<const void*>(plan->kernel);
  cudaFuncAttributes attr{};
  cudaError_t error = cudaFuncGetAttributes(&attr, func);
  if (error != cudaSuccess)
    return cuda_error_status(error, "cudaFuncGetAttributes", __FILE__, __LINE__).with_context(where);
  const int threads = static_cast<int>(ks.block[0] * ks.block[1] * ks.block[2]);  // validated <= 1024
  const int cluster = std::max(attr.requiredClusterWidth, 1);
  if (attr.requiredClusterHeight > 1 || attr.requiredClusterDepth > 1)
    return make_status(StatusCode::kIncompatible,
                       "%s: a persistent kernel with clusters of %dx%dx%d blocks; its grid is 1-D, so "
                       "clusters must be too",
                       where.c_str(), attr.requiredClusterWidth, attr.requiredClusterHeight,
                       attr.requiredClusterDepth);
  if (attr.clusterDimMustBeSet && attr.requiredClusterWidth <= 0)
    return make_status(StatusCode::kIncompatible,
                       "%s: a persistent kernel that needs a cluster size at launch; only compiled "
                       "cluster sizes (__cluster_dims__) are supported",
                       where.c_str());
  uint64_t co_resident = 0;
  std::string how;
  if (attr.requiredClusterWidth > 0) {
    // The config's cluster size is left unset: the compiled one applies.
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
    config.blockDim = dim3(ks.block[0], ks.block[1], ks.block[2]);
    config.dynamicSmemBytes = ks.shared_bytes;
    int clusters = 0;
    error = cudaOccupancyMaxActiveClusters(&clusters, func, &config);
    if (error != cudaSuccess)
      return cuda_error_status(error, "cudaOccupancyMaxActiveClusters", __FILE__, __LINE__).with_context(where);
    co_resident = static_cast<uint64_t>(clusters) * static_cast<uint64_t>(cluster);
    how = std::to_string(clusters) + " clusters of " + std::to_string(cluster) + " blocks";
  } else {
    int per_sm = 0;
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, func, threads, ks.shared_bytes);
    if (error != cudaSuccess)
      return cuda_error_status(error, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", __FILE__, __LINE__)
          .with_context(where);
    co_resident = static_cast<uint64_t>(per_sm) * static_cast<uint64_t>(std::max(device.sm_count, 0));
    how = std::to_string(per_sm) + " blocks per SM x " + std::to_string(device.sm_count) + " SMs";
  }
  uint64_t blocks = std::min<uint64_t>(ks.grid[0], co_resident);
  blocks -= blocks % static_cast<uint64_t>(cluster);
  if (blocks < ks.min_blocks)
    return make_status(StatusCode::kIncompatible,
                       "%s: a persistent kernel (its blocks wait on each other, so all must be resident "
                       "at once) needs at least %u blocks (min_blocks), but this GPU (%s, sm_%d) gives it "
                       "%llu: %llu co-resident (%s, with %d threads, %u bytes of dynamic and %zu of static "
                       "shared memory per block, %d registers per thread), at most %u (grid[0])%s",
                       where.c_str(), ks.min_blocks, device.name.c_str(), device.sm,
                       static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(co_resident),
                       how.c_str(), threads, ks.shared_bytes, attr.sharedSizeBytes, attr.numRegs, ks.grid[0],
                       cluster > 1 ? (", in whole clusters of " + std::to_string(cluster)).c_str() : "");
  plan->grid = dim3(static_cast<unsigned>(blocks), 1, 1);
  log_message(LogLevel::kInfo, "%s: persistent kernel: grid of %llu blocks (co-resident on %s: %llu = %s; the engine "
              "allows %u, needs at least %u)",
              where.c_str(), static_cast<unsigned long long>(blocks), device.name.c_str(),
              static_cast<unsigned long long>(co_resident), how.c_str(), ks.grid[0], ks.min_blocks);
  return Status::ok();
}

Status resolve_kernels(engine::EngineDesc& desc, const DeviceInfo& device, KernelPlans* out) {
  // Largest dynamic shared memory each kernel is launched with; kernels that
  // need more than the default limit are opted in once, to the maximum.
  std::map<cudaKernel_t, uint32_t> opt_in_bytes;
  std::set<std::pair<cudaKernel_t, size_t>> probed;  // (kernel, argument count)
  for (size_t i = 0; i < desc.steps.size(); ++i) {
    if (desc.steps[i].kind != StepKind::kKernel) continue;
    const engine::KernelStep& ks = desc.steps[i].kernel;
    const KernelModule& module = desc.modules[ks.module];
    const std::string where = step_label(desc, i) + ": kernel '" + ks.function +
                              "' in module '" + module.name + "'";
    KernelPlan& plan = out->plans[i];
    cudaError_t error = cudaLibraryGetKernel(&plan.kernel, out->libraries[ks.module],
                                             ks.function.c_str());
    if (error == cudaErrorSymbolNotFound) {
      (void)cudaGetLastError();
      // The engine names a function its own module lacks: a broken engine.
      return make_status(StatusCode::kCorruptData, "%s: no such function in the module",
                         where.c_str());
    }
    if (error != cudaSuccess)
      return cuda_error_status(error, "cudaLibraryGetKernel", __FILE__, __LINE__)
          .with_context(where);
    const void* func = reinterpret_cast<const void*>(plan.kernel);

    // Also forces the kernel onto the GPU now (lazy loading would otherwise
    // defer JIT and its errors to the first launch).
    cudaFuncAttributes attr{};
    error = cudaFuncGetAttributes(&attr, func);
    if (error != cudaSuccess)
      return cuda_error_status(error, "cudaFuncGetAttributes", __FILE__, __LINE__)
          .with_context(where);

    const unsigned long long threads =
        1ull * ks.block[0] * ks.block[1] * ks.block[2];
    if (threads > static_cast<unsigned long long>(attr.maxThreadsPerBlock))
      return make_status(StatusCode::kIncompatible,
                         "%s: launched with %llu threads per block, but on sm_%d it allows at "
                         "most %d (%d registers per thread)",
                         where.c_str(), threads, device.sm, attr.maxThreadsPerBlock,
                         attr.numRegs);
    const size_t total_shared = attr.sharedSizeBytes + ks.shared_bytes;
    if (total_shared > device.max_shared_per_block_optin)
      return make_status(StatusCode::kIncompatible,
                         "%s: needs %zu bytes of shared memory (%zu static + %u dynamic); this "
                         "GPU allows %zu per block",
                         where.c_str(), total_shared, attr.sharedSizeBytes, ks.shared_bytes,
                         device.max_shared_per_block_optin);
    if (ks.shared_bytes > static_cast<uint32_t>(attr.maxDynamicSharedSizeBytes)) {
      uint32_t& bytes = opt_in_bytes[plan.kernel];
      bytes = std::max(bytes, ks.shared_bytes);
    }

    // Check the argument list against the kernel's parameters where the driver
    // can tell (cudaFuncGetParamInfo needs a 12.4+ driver; skipped otherwise).
    bool checked = true;
    for (size_t a = 0; a < ks.args.size() && checked; ++a) {
      size_t offset = 0, size = 0;
      if (cudaFuncGetParamInfo(func, a, &offset, &size) != cudaSuccess) {
        (void)cudaGetLastError();
        checked = false;
        break;
      }
      const size_t expected = kernel_arg_bytes(ks.args[a].kind);
      if (size != expected)
        return make_status(StatusCode::kIncompatible,
                           "%s: parameter %zu is %zu bytes but the engine passes a %s (%zu bytes)",
                           where.c_str(), a, size, kernel_arg_name(ks.args[a].kind), expected);
    }
    // Probing one past the last argument must fail; the failed call shows up
    // in compute-sanitizer's API error report, so probe each kernel once.
    if (checked && probed.insert({plan.kernel, ks.args.size()}).second) {
      size_t offset = 0, size = 0;
      if (cudaFuncGetParamInfo(func, ks.args.size(), &offset, &size) == cudaSuccess)
        return make_status(StatusCode::kIncompatible,
                           "%s: the kernel takes more than the %zu arguments the engine passes",
                           where.c_str(), ks.args.size());
      (void)cudaGetLastError();
    }

    plan.grid = dim3(ks.grid[0], ks.grid[1], ks.grid[2]);
    plan.block = dim3(ks.block[0], ks.block[1], ks.block[2]);
    plan.shared_bytes = ks.shared_bytes;
    // A persistent kernel launched early could start some blocks while the
    // previous kernel still holds SMs; it always launches the classic way.
    plan.programmatic = out->programmatic[ks.module] && ks.min_blocks == 0;
  }
  for (const auto& [kernel, bytes] : opt_in_bytes) {
    cudaError_t error = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes));
    if (error != cudaSuccess)
      return cuda_error_status(error, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)",
                               __FILE__, __LINE__)
          .with_context("opting a kernel in to " + std::to_string(bytes) +
                        " bytes of dynamic shared memory");
  }
  // Occupancy depends on the opt-in above, so persistent grids are chosen after it.
  for (size_t i = 0; i < desc.steps.size(); ++i)
    if (desc.steps[i].kind == StepKind::kKernel && desc.steps[i].kernel.min_blocks > 0)
      KILN_RETURN_IF_ERROR(choose_persistent_grid(desc, i, device, &out->plans[i]));
  // The driver has its own copy of each image now.
  for (KernelModule& m : desc.modules) {
    for (auto& cubin : m.cubins) std::vector<uint8_t>().swap(cubin.image);
    std::string().swap(m.ptx);
  }
  return Status::ok();
}

Result<std::unique_ptr<StepKindPlans>> load(StepLoadEnv& env) {
  const bool any_kernel =
      std::any_of(env.desc.steps.begin(), env.desc.steps.end(),
                  [](const engine::Step& s) { return s.kind == StepKind::kKernel; });
  if (!any_kernel && env.desc.modules.empty()) return std::unique_ptr<StepKindPlans>();
  auto plans = std::make_unique<KernelPlans>();
  plans->plans.resize(env.desc.steps.size());
  // On failure `plans` is destroyed, which unloads what was loaded so far.
  KILN_RETURN_IF_ERROR(load_modules(env.desc, env.device, plans.get()));
  KILN_RETURN_IF_ERROR(resolve_kernels(env.desc, env.device, plans.get()));
  return std::unique_ptr<StepKindPlans>(std::move(plans));
}

}  // namespace

bool kernel_step_launch(const Engine& engine, size_t step, KernelStepLaunch* out) {
  const auto* plans = static_cast<const KernelPlans*>(engine.step_plans(StepKind::kKernel));
  if (plans == nullptr || step >= plans->plans.size() || step >= engine.desc().steps.size() ||
      engine.desc().steps[step].kind != StepKind::kKernel)
    return false;
  const KernelPlan& plan = plans->plans[step];
  out->grid[0] = plan.grid.x, out->grid[1] = plan.grid.y, out->grid[2] = plan.grid.z;
  out->block[0] = plan.block.x, out->block[1] = plan.block.y, out->block[2] = plan.block.z;
  out->shared_bytes = plan.shared_bytes;
  out->programmatic = plan.programmatic;
  return true;
}

Status check_persistent_grids(const Engine& engine, cudaStream_t stream) {
  const auto* plans = static_cast<const KernelPlans*>(engine.step_plans(StepKind::kKernel));
  const engine::EngineDesc& desc = engine.desc();
  if (plans == nullptr) return Status::ok();
  for (size_t i = 0; i < desc.steps.size() && i < plans->plans.size(); ++i) {
    if (desc.steps[i].kind != StepKind::kKernel || desc.steps[i].kernel.min_blocks == 0) continue;
    const KernelPlan& plan = plans->plans[i];
    const void* func = reinterpret_cast<const void*>(plan.kernel);
    cudaFuncAttributes attr{};
    KILN_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, func));
    const unsigned cluster = static_cast<unsigned>(std::max(attr.requiredClusterWidth, 1));
    // The occupancy of a context-less kernel is computed in the stream's context: a green
    // context's SMs for its streams. A kernel without compiled clusters asks in clusters of one.
    cudaLaunchConfig_t config{};
    cudaLaunchAttribute one_block{};
    config.gridDim = dim3(cluster, 1, 1);
    config.blockDim = plan.block;
    config.dynamicSmemBytes = plan.shared_bytes;
    config.stream = stream;
    if (attr.requiredClusterWidth <= 0) {
      one_block.id = cudaLaunchAttributeClusterDimension;
      one_block.val.clusterDim.x = one_block.val.clusterDim.y = one_block.val.clusterDim.z = 1;
      config.attrs = &one_block;
      config.numAttrs = 1;
    }
    int clusters = 0;
    KILN_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, func, &config));
    const uint64_t fit = static_cast<uint64_t>(clusters) * cluster;
    if (fit < plan.grid.x)
      return make_status(StatusCode::kIncompatible,
                         "%s: a persistent kernel (its blocks wait on each other, so all must be resident at "
                         "once) runs %u blocks, chosen at load for the whole GPU, but only %llu fit on the SMs "
                         "of the stream it was given (a green context or another partition of the GPU?); "
                         "run this engine on a stream with the whole GPU, or export without "
                         "persistent_decode",
                         step_label(desc, i).c_str(), plan.grid.x, static_cast<unsigned long long>(fit));
  }
  return Status::ok();
}

extern const StepRuntime kKernelStepRuntime = {StepKind::kKernel, LoadStage::kBeforeWeights,
                                               load};

}  // namespace kiln::runtime
