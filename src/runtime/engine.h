// A loaded engine: everything about an EngineDesc that can be prepared once
// per GPU and then shared, read-only, by every ExecutionContext that runs it.
//
// Engine::load uploads the weights once and lets every step kind prepare its
// steps (step_runtime.h: the kernel kind picks the machine code for this GPU
// and loads the generated kernels, GEMMs are planned with cuBLASLt and convs
// with cuDNN, algorithms timed at load). After load nothing in an Engine
// changes, so several contexts (one per delegate handle, possibly on
// different threads) may use one Engine concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "engine_format/input_bounds.h"
#include "runtime/derived_weights.h"
#include "runtime/device.h"
#include "runtime/named_weight_cache.h"
#include "runtime/state_registry.h"
#include "runtime/step_runtime.h"

namespace kiln::runtime {

// Where an engine's named weights come from: the program's named data (the
// delegate adapts ExecuTorch's NamedDataMap). No ExecuTorch types here.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Calls `use(data, size)` with the bytes stored under `key`, valid only
  // during the call; returns use's Status, or an error naming the key when
  // there is no such key (kCorruptData) or it cannot be read.
  virtual Status read(const std::string& key,
                      const std::function<Status(const void*, size_t)>& use) const = 0;
};

// How Engine::load got its named weights.
struct NamedWeightLoadStats {
  size_t uploaded = 0;        // named weights copied to the GPU by this load
  uint64_t uploaded_bytes = 0;
  size_t reused = 0;          // already on the GPU (another engine, method or load)
  uint64_t reused_bytes = 0;
  size_t mismatches = 0;      // a live copy had the key with other bytes: not shared
};

class Engine {
 public:
  // Loads `desc` onto CUDA device `device`, which is left current on the
  // calling thread. Fails with kIncompatible when a kernel module has no code
  // this GPU can run, kUnavailable without a GPU, kOutOfMemory, kUnsupported
  // for a GEMM cuBLASLt cannot do or a step kind this runtime cannot run,
  // kInternal for other CUDA failures.
  // The weights and kernel images are released from the stored desc once they
  // are on the GPU.
  // Named weights (engine_desc.h NamedWeight) are read from `weights` and
  // checked (size, hash), then taken from process_named_weight_cache(): one
  // device copy per device and content, shared with every engine naming it
  // (`share_weights` false: a private copy). An engine with named weights and
  // no `weights` fails with kInvalidArgument.
  // Derived weights (engine_desc.h DerivedWeight) are then made from those
  // weights, privately for this Engine (one info log line each).
  // Mutable states (engine_desc.h StateDesc) come from
  // process_state_registry() in `state_scope`: one device buffer per
  // (device, scope, key), shared with every engine naming it.
  static Result<std::unique_ptr<Engine>> load(engine::EngineDesc desc, int device,
                                              const WeightSource* weights = nullptr,
                                              bool share_weights = true,
                                              NamedWeightLoadStats* stats = nullptr,
                                              const std::string& state_scope = "");

  ~Engine();  // frees every GPU resource; errors are ignored
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The plan as loaded; `weights` and module images/PTX are empty here.
  const engine::EngineDesc& desc() const { return desc_; }
  const DeviceInfo& device_info() const { return device_; }
  int device() const { return device_.ordinal; }

  size_t num_inputs() const { return desc_.inputs.size(); }
  size_t num_outputs() const { return desc_.outputs.size(); }
  const engine::TensorDesc& input(size_t i) const { return desc_.tensors[desc_.inputs[i]]; }
  const engine::TensorDesc& output(size_t i) const { return desc_.tensors[desc_.outputs[i]]; }

  // Device base of the uploaded weights blob (nullptr when it is empty).
  const void* weights() const { return weights_; }
  size_t weights_bytes() const { return weights_bytes_; }
  // Device address of a weight tensor (inline, named or derived); nullptr for others.
  const void* weight_address(const engine::TensorDesc& t) const;
  // Named weights this engine holds (shared device copies), in desc order.
  const std::vector<std::shared_ptr<const DeviceWeight>>& named_weights() const {
    return named_;
  }
  // Device address of a state tensor (mutable, fixed for the engine's life).
  void* state_address(const engine::TensorDesc& t) const;
  // The states this engine holds, in desc order, and how many were already
  // live when it loaded (another method or load in the same scope).
  const std::vector<std::shared_ptr<DeviceState>>& states() const { return states_; }
  size_t states_reused() const { return states_reused_; }
  // The index inputs and the values each may hold (engine_format/input_bounds.h); the execution
  // context checks host-resident ones before each run.
  const std::vector<engine::InputBound>& input_bounds() const { return input_bounds_; }
  // Bytes of named weights this engine uses (each counted once).
  uint64_t named_weights_bytes() const { return named_bytes_; }
  // Bytes of device memory of the weights this engine made at load (its own).
  uint64_t derived_weights_bytes() const { return derived_.bytes(); }
  // The largest workspace any planned step (GEMM, conv) needs. Steps run one after
  // another on one stream, so a context allocates one buffer of this size.
  size_t workspace_bytes() const { return workspace_bytes_; }
  // What step kind `kind` prepared at load for its steps; nullptr when the
  // engine has no step of that kind. Owned by the Engine.
  const StepKindPlans* step_plans(engine::StepKind kind) const {
    const size_t id = static_cast<size_t>(kind);
    return id < kinds_.size() ? kinds_[id].get() : nullptr;
  }

 private:
  Engine() = default;
  Status check_kinds() const;
  Status load_kinds(LoadStage stage);
  Status upload_weights();
  Status acquire_named_weights(const WeightSource* source, bool share, NamedWeightLoadStats* stats);
  Status acquire_states(const std::string& scope);

  engine::EngineDesc desc_;
  DeviceInfo device_;
  // Indexed by StepKind id; null for kinds the engine does not use.
  std::vector<std::unique_ptr<StepKindPlans>> kinds_;
  void* weights_ = nullptr;
  size_t weights_bytes_ = 0;
  std::vector<std::shared_ptr<const DeviceWeight>> named_;  // by desc_.named_weights index
  std::vector<const void*> named_bases_;  // named_[i]->data(), for StepLoadEnv
  uint64_t named_bytes_ = 0;
  DerivedWeights derived_;  // by desc_.derived_weights index
  std::vector<std::shared_ptr<DeviceState>> states_;  // by desc_.states index
  size_t states_reused_ = 0;
  std::vector<engine::InputBound> input_bounds_;
  size_t workspace_bytes_ = 0;
};

// kInvalidArgument naming the first key when an engine keeps weights in the
// program's named data (`wanted` not empty) and the load was given none.
Status require_named_data(const std::vector<engine::NamedWeight>& wanted, const WeightSource* source);

// Byte alignment (<= 256) of a tensor's device address: engine inputs and
// outputs have buffers of their own, arena, state and weight tensors (inline,
// named or derived) sit at `offset` from a 256-byte aligned base.
uint32_t address_alignment(const engine::TensorDesc& t);

// "step 3 ('addmm+gelu')", for messages.
std::string step_label(const engine::EngineDesc& desc, size_t step);

}  // namespace kiln::runtime
