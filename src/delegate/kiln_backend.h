// The ExecuTorch delegate for Kiln engines. A .pte's "KilnBackend" delegate
// blob is a serialized engine (engine_format.h); init() loads it onto the
// current CUDA device (sharing the immutable Engine with other loads of the
// same bytes), execute() runs it on host or CUDA tensors on the caller's
// stream (kiln::CallerStreamGuard, else cudaStreamPerThread), destroy() frees
// it. Options: backend_options.h.
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

  // `args` holds the engine inputs followed by its outputs, whose dtype and
  // shape match the engine exactly. Host tensors are staged; CUDA tensors on
  // the engine's device are used in place. Synchronous when any argument is
  // on the host (the outputs are written when it returns); with only CUDA
  // tensors the work is left enqueued on the stream.
  executorch::runtime::Error execute(executorch::runtime::BackendExecutionContext& context,
                                     executorch::runtime::DelegateHandle* handle,
                                     executorch::runtime::Span<executorch::runtime::EValue*> args)
      const override;

  // Frees the GPU resources of a handle returned by init().
  void destroy(executorch::runtime::DelegateHandle* handle) const override;

  // Process-wide options (keys in backend_options.h). The whole list is
  // validated before any of it is applied: an unknown key, a non-bool value
  // or a key given twice fails with InvalidArgument and changes nothing.
  // New values apply to engines loaded afterwards.
  executorch::runtime::Error set_option(
      executorch::runtime::BackendOptionContext& context,
      const executorch::runtime::Span<executorch::runtime::BackendOption>& backend_options)
      override;

  // Fills each requested key: the three settings (bool) and the process-wide
  // counters (int) h2d_copies, d2h_copies, graph_launches, graph_records,
  // runs, shared_engine_loads, named_weight_uploads, named_weight_reuses.
  executorch::runtime::Error get_option(
      executorch::runtime::BackendOptionContext& context,
      executorch::runtime::Span<executorch::runtime::BackendOption>& backend_options) override;
};

// The registered instance (never destroyed, so it outlives every program).
KILN_DELEGATE_API KilnBackend& kiln_backend();

}  // namespace kiln::delegate
