// Conv steps, run side: what tests and tools may ask of a loaded engine's conv
// plans (the kind itself registers through step_runtime.h).
#pragma once

#include <cstddef>

#include "runtime/conv_plan.h"
#include "runtime/engine.h"

namespace kiln::runtime {

// The plan (descriptors, chosen algorithm, cache key) of conv step `step`;
// nullptr when that step is not a conv. Owned by `engine`.
const ConvPlan* conv_step_plan(const Engine& engine, size_t step);

}  // namespace kiln::runtime
