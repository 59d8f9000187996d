// Programmatic dependent launch for generated kernels (sm_90 and newer).
//
// A decode step or a batch-1 network is hundreds of short kernels; on an
// H200 each kernel boundary costs a few microseconds of launch latency and
// ramp-up, more than many of the kernels run. With programmatic dependent
// launch the next kernel is launched while the current one still runs: each
// kernel first lets its own successor launch
// (griddepcontrol.launch_dependents), then waits for its predecessor's grid
// to finish and its writes to become visible (griddepcontrol.wait). The
// waiting happens on the GPU, so the launch latency hides behind the previous
// kernel's execution, and a kernel whose blocks find a free slot can read its
// weights before its wait: where a kernel's source places
// grid_dependency_wait() (a PTX comment that the patch below turns into the
// wait), the code above it reads only constants, and the wait goes there
// instead of the top (gemv_kernel.cpp: a product's first weight loads;
// benchmarks/micro/gemv_chain_pipelined.cu, H100: the decode's chain of GEMVs
// 0.600 -> 0.505 ms). Triggering first is safe because nothing above a wait
// touches memory that a kernel writes, a successor's blocks launch only once
// all of this kernel's blocks run, and each wait covers the whole chain before
// it.
//
// The module's PTX is compiled once for the oldest target SM (compute_80
// has no griddepcontrol), so the instructions are added to the PTX that the
// sm_90-and-newer cubins are assembled from: the same code with the trigger
// (and the wait, unless a marker places it) at the top of every entry, and
// `.target` raised to sm_90. The PTX kept in the engine for JIT stays
// unchanged (the marker is a comment there); the runtime launches a kernel
// with the programmatic attribute only when it runs such a cubin
// (runtime/steps/kernel_step_exec.cpp). Since every kernel waits before it
// touches memory that kernels write, the order of those reads and writes is
// the stream's order.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::codegen {

// The oldest SM with griddepcontrol.
constexpr uint32_t kGridDependencyMinSm = 90;

// The text of the wait marker.
constexpr const char* kGridDependencyWaitMarker = "kiln_grid_dependency_wait";

// The CUDA statement a generated kernel places where its wait belongs (once,
// in the kernel's own body): above it the kernel may read constants
// (weights) only, never a tensor that a kernel writes.
std::string grid_dependency_wait();

// `ptx` (NVRTC output for compute_XX, XX < 90 or not) with
// griddepcontrol.launch_dependents as the first instruction of every .entry,
// griddepcontrol.wait where the entry's marker is, or else right after the
// trigger, and `.target` at least sm_90. Throws CompileError when the text is
// not PTX as NVRTC writes it (no .target, or an .entry without a body) or a
// marker is outside an entry's body or repeated in one.
std::string add_grid_dependency(const std::string& ptx);

}  // namespace kiln::codegen
