// GEMM steps, run side: what tests and tools may ask of a loaded engine's GEMM
// plans (the kind itself registers through step_runtime.h).
#pragma once

#include <cstddef>

#include "runtime/engine.h"
#include "runtime/gemm_plan.h"

namespace kiln::runtime {

// The plan (descriptors, chosen algorithm, cache key) of GEMM step `step`;
// nullptr when that step is not a GEMM. Owned by `engine`.
const GemmPlan* gemm_step_plan(const Engine& engine, size_t step);

}  // namespace kiln::runtime
