// The ExecuTorch delegate for Kiln engines. A .pte's "KilnBackend" delegate
// blob is a serialized engine (engine_format.h); init() loads it onto the
// current CUDA device, execute() runs it on host tensors, destroy() frees it.
//
// Linking libexecutorch_backend_kiln.so registers the backend (and the CUDA
// DeviceAllocator, see cuda_device_allocator.h) from static initializers, so
// link it with --no-as-needed (CMake target kiln::backend does).
#pragma once

#include <cstddef>

#include <executorch/runtime/backend/interface.h>

#ifndef KILN_DELEGATE_API
#define KILN_DELEGATE_API __attribute__((visibility("default")))
#endif

namespace kiln::delegate {

// The name the exporter writes into the .pte and register_backend uses.
inline constexpr const char kBackendName[] = "KilnBackend";

// Most engine inputs (and, separately, outputs) one delegate call may have:
// execute() keeps per-call pointers in fixed arrays of this size.
inline constexpr size_t kMaxEngineArgs = 64;

class KILN_DELEGATE_API KilnBackend final : public executorch::runtime::BackendInterface {
 public:
  // True when a CUDA GPU is usable; checked once per process.
  bool is_available() const override;

  // Parses and loads the engine in `processed` and allocates its execution
  // context; the handle lives in the method's runtime allocator. Frees
  // `processed` on success.
  executorch::runtime::Result<executorch::runtime::DelegateHandle*> init(
      executorch::runtime::BackendInitContext& context,
      executorch::runtime::FreeableBuffer* processed,
      executorch::runtime::ArrayRef<executorch::runtime::CompileSpec> compile_specs)
      const override;

  // `args` holds the engine inputs followed by its outputs, all host (CPU)
  // tensors whose dtype and shape match the engine exactly. Synchronous: the
  // outputs are in host memory when it returns.
  executorch::runtime::Error execute(executorch::runtime::BackendExecutionContext& context,
                                     executorch::runtime::DelegateHandle* handle,
                                     executorch::runtime::Span<executorch::runtime::EValue*> args)
      const override;

  // Frees the GPU resources of a handle returned by init().
  void destroy(executorch::runtime::DelegateHandle* handle) const override;
};

// The registered instance (never destroyed, so it outlives every program).
KILN_DELEGATE_API KilnBackend& kiln_backend();

}  // namespace kiln::delegate
