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
// A kernel may also start before its wait: where its source places
// grid_dependency_wait() (a PTX comment that the patch below turns into the
// wait), the code above the marker reads only constants (or prefetches into
// L2, which reads nothing into the kernel), and the kernel
// triggers first, then runs that code, then waits. A matrix-vector product
// does this with its first weight loads (gemv_kernel.cpp), so its weights
// stream while its predecessor computes; a decode attention prefetches its
// KV-cache rows into L2 there (attention_decode_kernel.cpp: a prefetch reads
// nothing into the kernel, so the row its predecessor is writing stays
// safe). Only such kernels trigger first: when
// every kernel did (measured on an H100, the 410M decode step), products
// launched several kernels ahead and their loads and waiting blocks slowed the
// kernels on the critical path (0.662 -> 0.690 ms a step); with only the
// products triggering first the run-ahead stays about one kernel deep (0.662 ->
// 0.655 ms; benchmarks/micro/gemv_chain_pipelined.cu has the chain of bare
// products, 0.600 -> 0.505 ms). A kernel that places its wait may also place
// its trigger (grid_dependency_trigger()): the q|k|v product that writes the
// rotary and cache rows itself triggers the attention only after its
// products, since the attention launched early got in its way (0.716 ->
// 0.643 ms a decode step, H100; docs/design_llm.md). Triggering first is safe because nothing above
// a wait touches memory that a kernel writes, a successor's blocks launch only
// once all of this kernel's blocks run, and each wait covers the whole chain
// before it.
//
// The module's PTX is compiled once for the oldest target SM (compute_80
// has no griddepcontrol), so the instructions are added to the PTX that the
// sm_90-and-newer cubins are assembled from: the same code with the wait and
// the trigger at the top of every entry (only the trigger where a marker
// places the wait), and `.target` raised to sm_90. The PTX kept in the engine for JIT stays
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
// The text of the trigger marker: a kernel that places its wait may also
// place its trigger (griddepcontrol.launch_dependents) later than its top,
// so that its successor launches only when this kernel is near its end.
constexpr const char* kGridDependencyTriggerMarker = "kiln_grid_dependency_trigger";

// The CUDA statement a generated kernel places where its wait belongs (once,
// in the kernel's own body): above it the kernel may read constants
// (weights) only, never a tensor that a kernel writes (an L2 prefetch, which
// reads nothing into the kernel, may name any tensor).
std::string grid_dependency_wait();
// The statement placing the trigger (once, after the wait marker).
std::string grid_dependency_trigger();

// `ptx` (NVRTC output for compute_XX, XX < 90 or not) with
// griddepcontrol.wait and griddepcontrol.launch_dependents as the first
// instructions of every .entry, except an entry with a marker: the trigger
// first, and the wait where the marker is; `.target` at least sm_90. Throws CompileError when the text is
// not PTX as NVRTC writes it (no .target, or an .entry without a body) or a
// marker is outside an entry's body or repeated in one.
std::string add_grid_dependency(const std::string& ptx);

}  // namespace kiln::codegen
