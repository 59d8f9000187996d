#include "runtime/engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine_format/engine_format.h"
#include "runtime/cuda_check.h"

namespace kiln::runtime {

using engine::EngineDesc;
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

std::string step_label(const EngineDesc& desc, size_t step) {
  std::string label = "step " + std::to_string(step);
  if (step < desc.steps.size()) label += " ('" + desc.steps[step].label + "')";
  return label;
}

Result<std::unique_ptr<Engine>> Engine::load(EngineDesc desc, int device,
                                             const WeightSource* weights, bool share_weights,
                                             NamedWeightLoadStats* stats, const std::string& state_scope) {
  // parse_engine already validated; this also covers hand-built descs so
  // every index below is safe.
  KILN_RETURN_IF_ERROR(engine::validate_engine(desc));
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, query_device(device));
  KILN_RETURN_IF_ERROR(ensure_current_device(device));

  std::unique_ptr<Engine> e(new Engine());
  // The index inputs' bounds (validated above, so this parses).
  if (const std::string* text = desc.find_metadata(engine::kInputBoundsKey)) {
    KILN_ASSIGN_OR_RETURN(e->input_bounds_, engine::parse_input_bounds(*text, desc.inputs.size()));
  }
  e->desc_ = std::move(desc);
  e->device_ = std::move(info);
  KILN_RETURN_IF_ERROR(e->check_kinds());
  // On any failure below `e` is destroyed, which frees what was made so far.
  // Kinds that can fail fast on this GPU (kernel code) load before the weights
  // are uploaded; plans that point into the weights after.
  KILN_RETURN_IF_ERROR(e->load_kinds(LoadStage::kBeforeWeights));
  KILN_RETURN_IF_ERROR(e->upload_weights());
  KILN_RETURN_IF_ERROR(e->acquire_named_weights(weights, share_weights, stats));
  KILN_RETURN_IF_ERROR(
      e->derived_.make(e->desc_, [&](const TensorDesc& t) { return e->weight_address(t); }));
  KILN_RETURN_IF_ERROR(e->acquire_states(state_scope));
  KILN_RETURN_IF_ERROR(e->load_kinds(LoadStage::kAfterWeights));
  return Result<std::unique_ptr<Engine>>(std::move(e));
}

Engine::~Engine() {
  // Later kinds may use what earlier ones made: release in reverse load order.
  for (auto it = step_runtimes().rbegin(); it != step_runtimes().rend(); ++it) {
    const size_t id = static_cast<size_t>((*it)->kind);
    if (id < kinds_.size()) kinds_[id].reset();
  }
  kinds_.clear();
  // derived_ frees its buffers as a member, after this body.
  named_.clear();  // the last engine holding a named weight frees it
  states_.clear();  // likewise a state
  if (weights_ != nullptr) (void)cudaFree(weights_);
  (void)cudaGetLastError();  // leave no error behind for the caller's next check
}

// Every step's kind must have a run side in this build (a format-only kind
// would otherwise be skipped silently).
Status Engine::check_kinds() const {
  for (size_t i = 0; i < desc_.steps.size(); ++i)
    if (find_step_runtime(desc_.steps[i].kind) == nullptr)
      return make_status(StatusCode::kUnsupported,
                         "%s: step kind %u has no executor in this Kiln runtime",
                         step_label(desc_, i).c_str(),
                         static_cast<unsigned>(desc_.steps[i].kind));
  return Status::ok();
}

Status Engine::load_kinds(LoadStage stage) {
  for (const StepRuntime* kind : step_runtimes()) {
    if (kind->stage != stage) continue;
    StepLoadEnv env{desc_, device_, weights_, named_bases_.data()};
    if (derived_.size() > 0) env.derived_weights = derived_.bases();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<StepKindPlans> plans, kind->load(env));
    const size_t id = static_cast<size_t>(kind->kind);
    if (kinds_.size() <= id) kinds_.resize(id + 1);
    kinds_[id] = std::move(plans);
    workspace_bytes_ = std::max(workspace_bytes_, env.workspace_bytes);
  }
  return Status::ok();
}

const void* Engine::weight_address(const TensorDesc& t) const {
  if (t.storage == StorageKind::kWeight)
    return static_cast<const uint8_t*>(weights_) + t.offset;
  if (t.storage == StorageKind::kNamedWeight && t.io_index < named_bases_.size())
    return static_cast<const uint8_t*>(named_bases_[t.io_index]) + t.offset;
  if (t.storage == StorageKind::kDerivedWeight && t.io_index < derived_.size())
    return static_cast<const uint8_t*>(derived_.bases()[t.io_index]) + t.offset;
  return nullptr;
}

Status require_named_data(const std::vector<engine::NamedWeight>& wanted, const WeightSource* source) {
  if (wanted.empty() || source != nullptr) return Status::ok();
    return make_status(StatusCode::kInvalidArgument,
                       "the engine keeps %zu weights in the program's named data (first key "
                       "'%s'), but no named data was given to the load (a .pte saved with "
                       "external weights needs its .ptd file: data_path)",
                       wanted.size(), wanted[0].key.c_str());
}

Status Engine::acquire_named_weights(const WeightSource* source, bool share,
                                     NamedWeightLoadStats* stats) {
  NamedWeightLoadStats local;
  NamedWeightLoadStats& s = stats != nullptr ? *stats : local;
  s = NamedWeightLoadStats{};
  const auto& wanted = desc_.named_weights;
  if (wanted.empty()) return Status::ok();
  KILN_RETURN_IF_ERROR(require_named_data(wanted, source));
  NamedWeightCache& cache = process_named_weight_cache();
  named_.reserve(wanted.size());
  for (const engine::NamedWeight& want : wanted) {
    NamedWeightCache::Acquired got;
    Status status = source->read(want.key, [&](const void* data, size_t size) -> Status {
      KILN_ASSIGN_OR_RETURN(got, cache.acquire(device_.ordinal, want, data, size, share));
      return Status::ok();
    });
    KILN_RETURN_IF_ERROR(status);
    if (got.reused) {
      ++s.reused;
      s.reused_bytes += want.nbytes;
    } else {
      ++s.uploaded;
      s.uploaded_bytes += want.nbytes;
    }
    if (got.mismatch) ++s.mismatches;
    named_bytes_ += want.nbytes;
    named_bases_.push_back(got.weight->data());
    named_.push_back(std::move(got.weight));
  }
  return Status::ok();
}

Status Engine::acquire_states(const std::string& scope) {
  StateRegistry& registry = process_state_registry();
  for (const engine::StateDesc& want : desc_.states) {
    KILN_ASSIGN_OR_RETURN(StateRegistry::Acquired got, registry.acquire(device_.ordinal, scope, want));
    states_reused_ += got.reused ? 1 : 0;
    states_.push_back(std::move(got.state));
  }
  return Status::ok();
}

void* Engine::state_address(const TensorDesc& t) const {
  if (t.storage != StorageKind::kState || t.io_index >= states_.size()) return nullptr;
  return static_cast<uint8_t*>(states_[t.io_index]->data()) + t.offset;
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
