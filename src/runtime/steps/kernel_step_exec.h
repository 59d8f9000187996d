// Kernel steps, run side: what tests and tools may ask of a loaded engine's
// kernel plans (the kind itself registers through step_runtime.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/engine.h"

namespace kiln::runtime {

// How kernel step `step` launches: its grid as chosen at load (for a
// persistent step, KernelStep::min_blocks > 0, the co-resident block count),
// block, dynamic shared memory, and whether with programmatic stream
// serialization.
struct KernelStepLaunch {
  uint32_t grid[3] = {0, 0, 0};
  uint32_t block[3] = {0, 0, 0};
  uint32_t shared_bytes = 0;
  bool programmatic = false;
};

// Fills `out` and returns true; false when step `step` is not a kernel step.
bool kernel_step_launch(const Engine& engine, size_t step, KernelStepLaunch* out);

// Checks that each persistent step's grid, chosen at load for the whole GPU, is co-resident on
// the SMs `stream` may use: a green context's stream may have fewer, and there the kernel's
// blocks would wait forever for blocks that cannot start. kIncompatible names the step, the
// blocks it needs and what the stream gives. A few CUDA calls: run it when the stream changes.
Status check_persistent_grids(const Engine& engine, cudaStream_t stream);

}  // namespace kiln::runtime
