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

Result<std::unique_ptr<Engine>> Engine::load(EngineDesc desc, int device) {
  // parse_engine already validated; this also covers hand-built descs so
  // every index below is safe.
  KILN_RETURN_IF_ERROR(engine::validate_engine(desc));
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, query_device(device));
  KILN_RETURN_IF_ERROR(ensure_current_device(device));

  std::unique_ptr<Engine> e(new Engine());
  e->desc_ = std::move(desc);
  e->device_ = std::move(info);
  KILN_RETURN_IF_ERROR(e->check_kinds());
  // On any failure below `e` is destroyed, which frees what was made so far.
  // Kinds that can fail fast on this GPU (kernel code) load before the weights
  // are uploaded; plans that point into the weights after.
  KILN_RETURN_IF_ERROR(e->load_kinds(LoadStage::kBeforeWeights));
  KILN_RETURN_IF_ERROR(e->upload_weights());
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
    StepLoadEnv env{desc_, device_, weights_};
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<StepKindPlans> plans, kind->load(env));
    const size_t id = static_cast<size_t>(kind->kind);
    if (kinds_.size() <= id) kinds_.resize(id + 1);
    kinds_[id] = std::move(plans);
    workspace_bytes_ = std::max(workspace_bytes_, env.workspace_bytes);
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
