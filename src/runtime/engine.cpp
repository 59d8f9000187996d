#include "runtime/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "engine_format/engine_format.h"
#include "runtime/cuda_check.h"

namespace kiln::runtime {

using engine::EngineDesc;
using engine::KernelArgKind;
using engine::KernelModule;
using engine::StepKind;
using engine::StorageKind;
using engine::TensorDesc;

uint32_t address_alignment(const TensorDesc& t) {
  // cudaMalloc returns 256-byte aligned memory; nothing needs more.
  constexpr uint64_t kMaxAlignment = 256;
  if (t.storage == StorageKind::kInput || t.storage == StorageKind::kOutput || t.offset == 0)
    return kMaxAlignment;
  uint64_t lowest_bit = t.offset & (~t.offset + 1);
  return static_cast<uint32_t>(std::min(lowest_bit, kMaxAlignment));
}

namespace {

// "sm_87, sm_90 (PTX compute_90)": what a module carries, for error messages.
std::string describe_code(const KernelModule& m) {
  std::string text;
  for (const auto& cubin : m.cubins) {
    if (!text.empty()) text += ", ";
    text += "sm_" + std::to_string(cubin.sm);
  }
  if (text.empty()) text = "no SM";
  if (m.ptx.empty())
    text += " (no PTX)";
  else
    text += " (PTX compute_" + std::to_string(m.ptx_sm) + ")";
  return text;
}

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

}  // namespace

std::string step_label(const EngineDesc& desc, size_t step) {
  std::string label = "step " + std::to_string(step);
  if (step < desc.steps.size()) label += " ('" + desc.steps[step].label + "')";
  return label;
}

Result<std::unique_ptr<Engine>> Engine::load(EngineDesc desc, int device) {
  // parse_engine already validated; this also covers hand-built descs so
  // every index below is safe.
  KILN_RETURN_IF_ERROR(engine::validate_engine(desc));
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, query_device(device));
  KILN_RETURN_IF_ERROR(ensure_current_device(device));

  std::unique_ptr<Engine> e(new Engine());
  e->desc_ = std::move(desc);
  e->device_ = std::move(info);
  e->kernels_.resize(e->desc_.steps.size());
  e->gemms_.resize(e->desc_.steps.size());
  e->convs_.resize(e->desc_.steps.size());
  // On any failure below `e` is destroyed, which frees what was made so far.
  KILN_RETURN_IF_ERROR(e->load_modules());
  KILN_RETURN_IF_ERROR(e->resolve_kernels());
  KILN_RETURN_IF_ERROR(e->upload_weights());
  KILN_RETURN_IF_ERROR(e->plan_gemms());
  KILN_RETURN_IF_ERROR(e->plan_convs());
  return Result<std::unique_ptr<Engine>>(std::move(e));
}

Engine::~Engine() {
  for (GemmPlan& p : gemms_) destroy_gemm_plan(&p);
  for (ConvPlan& p : convs_) destroy_conv_plan(&p);
  if (zero_bias_ != nullptr) (void)cudaFree(zero_bias_);
  if (cublas_ != nullptr) (void)cublasLtDestroy(cublas_);
  if (weights_ != nullptr) (void)cudaFree(weights_);
  for (cudaLibrary_t lib : libraries_) (void)cudaLibraryUnload(lib);
  (void)cudaGetLastError();  // leave no error behind for the caller's next check
}

Status Engine::load_modules() {
  const uint32_t sm = static_cast<uint32_t>(device_.sm);
  libraries_.reserve(desc_.modules.size());
  for (KernelModule& m : desc_.modules) {
    const void* image = nullptr;
    std::string which;
    for (const auto& cubin : m.cubins) {
      if (cubin.sm == sm) {
        image = cubin.image.data();
        which = "cubin sm_" + std::to_string(sm);
      }
    }
    if (image == nullptr && !m.ptx.empty() && m.ptx_sm <= sm) {
      image = m.ptx.c_str();  // NUL-terminated, as the loader requires
      which = "PTX compute_" + std::to_string(m.ptx_sm);
    }
    if (image == nullptr)
      return make_status(StatusCode::kIncompatible,
                         "engine module '%s' has code for %s; this GPU is sm_%u", m.name.c_str(),
                         describe_code(m).c_str(), sm);

    // The JIT's error log says why PTX failed to compile; keep it for the message.
    // Only passed for PTX: a cubin involves no compiler.
    const bool from_ptx = image == static_cast<const void*>(m.ptx.c_str());
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
    libraries_.push_back(library);
  }
  return Status::ok();
}

Status Engine::resolve_kernels() {
  // Largest dynamic shared memory each kernel is launched with; kernels that
  // need more than the default limit are opted in once, to the maximum.
  std::map<cudaKernel_t, uint32_t> opt_in_bytes;
  std::set<std::pair<cudaKernel_t, size_t>> probed;  // (kernel, argument count)
  for (size_t i = 0; i < desc_.steps.size(); ++i) {
    if (desc_.steps[i].kind != StepKind::kKernel) continue;
    const engine::KernelStep& ks = desc_.steps[i].kernel;
    const KernelModule& module = desc_.modules[ks.module];
    const std::string where = step_label(desc_, i) + ": kernel '" + ks.function +
                              "' in module '" + module.name + "'";
    KernelPlan& plan = kernels_[i];
    cudaError_t error = cudaLibraryGetKernel(&plan.kernel, libraries_[ks.module],
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
                         where.c_str(), threads, device_.sm, attr.maxThreadsPerBlock,
                         attr.numRegs);
    const size_t total_shared = attr.sharedSizeBytes + ks.shared_bytes;
    if (total_shared > device_.max_shared_per_block_optin)
      return make_status(StatusCode::kIncompatible,
                         "%s: needs %zu bytes of shared memory (%zu static + %u dynamic); this "
                         "GPU allows %zu per block",
                         where.c_str(), total_shared, attr.sharedSizeBytes, ks.shared_bytes,
                         device_.max_shared_per_block_optin);
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
  // The driver has its own copy of each image now.
  for (KernelModule& m : desc_.modules) {
    for (auto& cubin : m.cubins) std::vector<uint8_t>().swap(cubin.image);
    std::string().swap(m.ptx);
  }
  return Status::ok();
}

Status Engine::upload_weights() {
  if (!desc_.weights.empty()) {
    KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&weights_, desc_.weights.size()));
    weights_bytes_ = desc_.weights.size();
    KILN_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(weights_, desc_.weights.data(), weights_bytes_, cudaMemcpyHostToDevice));
  }
  std::vector<uint8_t>().swap(desc_.weights);  // the host copy is no longer needed
  return Status::ok();
}

}  // namespace kiln::runtime
