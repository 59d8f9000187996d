// Programmatic dependent launch for generated kernels (sm_90 and newer).
//
// A decode step or a batch-1 network is hundreds of short kernels; on an
// H200 each kernel boundary costs a few microseconds of launch latency and
// ramp-up, more than many of the kernels run. With programmatic dependent
// launch the next kernel is launched while the current one still runs: each
// kernel first waits for its predecessor's grid to finish and its writes to
// become visible (griddepcontrol.wait), then lets its own successor launch
// (griddepcontrol.launch_dependents). The waiting happens on the GPU, so the
// launch latency hides behind the previous kernel's execution.
//
// The module's PTX is compiled once for the oldest target SM (compute_80
// has no griddepcontrol), so the instructions are added to the PTX that the
// sm_90-and-newer cubins are assembled from: the same code with the two
// instructions at the top of every entry, and `.target` raised to sm_90.
// The PTX kept in the engine for JIT stays unchanged; the runtime launches a
// kernel with the programmatic attribute only when it runs such a cubin
// (runtime/steps/kernel_step_exec.cpp). Since every kernel waits before it
// touches memory, the order of all reads and writes is the stream's order.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::codegen {

// The oldest SM with griddepcontrol.
constexpr uint32_t kGridDependencyMinSm = 90;

// `ptx` (NVRTC output for compute_XX, XX < 90 or not) with
// griddepcontrol.wait and griddepcontrol.launch_dependents as the first
// instructions of every .entry, and `.target` at least sm_90. Throws
// CompileError when the text is not PTX as NVRTC writes it (no .target, or
// an .entry without a body).
std::string add_grid_dependency(const std::string& ptx);

}  // namespace kiln::codegen
