// Step kinds, run side: every kind of engine step registers ONE StepRuntime
// here, keyed by the same on-disk StepKind id as its StepFormat
// (engine_format/step_format.h: codec, validator, inspect). The registration
// says how to prepare every step of the kind at Engine::load (handles, plans,
// load-time algorithm choice) and, per ExecutionContext, how to make each
// step's executor. Engine and ExecutionContext only loop over these; neither
// switches on the kind.
//
// A kind's run-side code lives in src/runtime/steps/<kind>_step_exec.cpp and
// is listed once in step_runtime_registry.cpp. See src/runtime/README.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/device.h"

namespace kiln::runtime {

class Engine;

// What a kind's loader works with at Engine::load.
struct StepLoadEnv {
  engine::EngineDesc& desc;  // validated; a loader may release what it consumed
                             // (the kernel kind drops module images)
  const DeviceInfo& device;
  const void* weights;        // device base of the weights; null before the upload
  // Device base of each named weight (EngineDesc::named_weights order); null
  // before the upload.
  const void* const* named_weights = nullptr;
  // Device base of each derived weight (EngineDesc::derived_weights order),
  // made after the named weights; null before (kBeforeWeights loaders).
  const void* const* derived_weights = nullptr;
  size_t workspace_bytes = 0;  // raise to the largest workspace one step needs

  // Device address of weight tensor `t` (inline, named or derived); after the
  // upload (kAfterWeights loaders).
  const void* weight_address(const engine::TensorDesc& t) const {
    if (t.storage == engine::StorageKind::kNamedWeight)
      return named_weights == nullptr
                 ? nullptr
                 : static_cast<const uint8_t*>(named_weights[t.io_index]) + t.offset;
    if (t.storage == engine::StorageKind::kDerivedWeight)
      return derived_weights == nullptr
                 ? nullptr
                 : static_cast<const uint8_t*>(derived_weights[t.io_index]) + t.offset;
    return static_cast<const uint8_t*>(weights) + t.offset;
  }
};

// One step, ready to run in one context. Created at ExecutionContext::create;
// run() is the hot path: no allocation, no exceptions, every CUDA call checked.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual Status run(cudaStream_t stream) = 0;
};

// How an executor learns this context's addresses. Tensor addresses that can
// move (inputs, outputs, arena: not weights) are recorded so that
// ExecutionContext::rebind can rewrite them without the kind's help.
class StepBinder {
 public:
  virtual ~StepBinder() = default;
  // Tensor `t`'s device address in this context now.
  virtual void* address(uint32_t t) = 0;
  // Stores address(t) in *slot and records it; `slot` must not move for the
  // context's life (a member of a heap-allocated executor is fine).
  virtual void bind(uint32_t t, void** slot) = 0;
  // For an address kept elsewhere (e.g. inside a cuBLASLt descriptor): records
  // it; rebind calls apply(target, new_address) when it moves. `apply` must
  // not allocate.
  virtual void bind_with(uint32_t t, Status (*apply)(void* target, void* address),
                         void* target) = 0;
  // The context's workspace, shared by the steps (they run one at a time).
  virtual void* workspace() const = 0;
  virtual size_t workspace_bytes() const = 0;
};

// A kind's per-context state (e.g. a cuDNN handle), made once per context.
class StepKindContext {
 public:
  virtual ~StepKindContext() = default;
  // The executor of step `step` (of this kind).
  virtual Result<std::unique_ptr<StepExecutor>> make_executor(size_t step, StepBinder& binder) = 0;
  // Whether this kind's steps can run on `stream` (e.g. all of a persistent kernel's blocks fit
  // on the SMs a green context's stream may use). Called by the context when a run's stream
  // differs from the last one checked, so it may make a few CUDA calls; must not allocate.
  virtual Status check_stream(cudaStream_t /*stream*/) { return Status::ok(); }
};

// What a kind prepared at load for every one of its steps (handles, plans);
// owned by the Engine, immutable afterwards, shared by every context.
class StepKindPlans {
 public:
  virtual ~StepKindPlans() = default;
  virtual Result<std::unique_ptr<StepKindContext>> create_context(const Engine& engine) const = 0;
};

// When a kind loads: before the weights are uploaded (what can fail fast on an
// incompatible GPU, e.g. kernel images) or after (plans that point into them).
enum class LoadStage : uint8_t { kBeforeWeights, kAfterWeights };

struct StepRuntime {
  engine::StepKind kind;
  LoadStage stage;
  // Prepares every step of this kind in env.desc; a null result (not an
  // error) when the engine has none, so nothing is created for it.
  Result<std::unique_ptr<StepKindPlans>> (*load)(StepLoadEnv& env);
};

// The registered run side of kind `kind`; nullptr when there is none.
const StepRuntime* find_step_runtime(engine::StepKind kind);
// Every registered kind, in load order.
const std::vector<const StepRuntime*>& step_runtimes();

}  // namespace kiln::runtime
