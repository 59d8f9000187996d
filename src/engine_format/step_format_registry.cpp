// The step kinds this build reads and writes: one line per kind.
//
// An explicit list rather than self-registering static objects on purpose:
// kiln_engine_format is a static library, and a linker drops any object file
// that nothing references, so a kind whose only link to the program is a
// static constructor would silently vanish from executables that do not link
// the archive whole (--whole-archive / $<LINK_LIBRARY:WHOLE_ARCHIVE>, which
// every consumer, including the ExecuTorch apps that link the delegate, would
// have to remember). Naming each kind here references it, so it is always
// linked, in a fixed order, with no static-initialization-order questions.
#include <cstdint>
#include <vector>

#include "engine_format/step_format.h"

namespace kiln::engine {

// Defined in steps/<kind>_step_format.cpp.
extern const StepFormat kGemmStepFormat;
extern const StepFormat kKernelStepFormat;
extern const StepFormat kConvStepFormat;

namespace {

std::vector<const StepFormat*> build_table() {
  std::vector<const StepFormat*> table = {
      &kGemmStepFormat,
      &kKernelStepFormat,
      &kConvStepFormat,
  };
  return table;
}

}  // namespace

const std::vector<const StepFormat*>& step_formats() {
  static const std::vector<const StepFormat*> table = build_table();
  return table;
}

const StepFormat* find_step_format(uint8_t kind) {
  for (const StepFormat* f : step_formats())
    if (static_cast<uint8_t>(f->kind) == kind) return f;
  return nullptr;
}

}  // namespace kiln::engine
