// The step kinds this runtime can run: one line per kind, in load order
// (kernels load before the weights upload, so a GPU without code for them
// fails fast; GEMMs then convs after it, as they point into the weights).
//
// An explicit list rather than self-registering static objects: kiln_runtime
// is a static library and the linker drops object files nothing references,
// so a kind registered only by a static constructor would vanish from apps
// that do not link the archive whole. See engine_format/step_format_registry.cpp.
#include <vector>

#include "runtime/step_runtime.h"

namespace kiln::runtime {

// Defined in steps/<kind>_step_exec.cpp.
extern const StepRuntime kKernelStepRuntime;
extern const StepRuntime kGemmStepRuntime;
extern const StepRuntime kConvStepRuntime;

const std::vector<const StepRuntime*>& step_runtimes() {
  static const std::vector<const StepRuntime*> table = {
      &kKernelStepRuntime,
      &kGemmStepRuntime,
      &kConvStepRuntime,
  };
  return table;
}

const StepRuntime* find_step_runtime(engine::StepKind kind) {
  for (const StepRuntime* r : step_runtimes())
    if (r->kind == kind) return r;
  return nullptr;
}

}  // namespace kiln::runtime
