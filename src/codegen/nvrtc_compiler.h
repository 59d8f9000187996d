// Compiles generated CUDA source at export time: a cubin for each target SM
// plus PTX for the oldest (newer GPUs JIT it), so no GPU is needed to build
// an engine.
//
// Export time: NVRTC compiles the source once, to PTX for the oldest target
// SM (compute_XX); nvJitLink then assembles that PTX into each SM's cubin on
// parallel threads. With the default eight SMs this took a third of the time
// of eight NVRTC compiles (mobilenet_v3_large's kernels: 18 s against 46 s
// on 2 busy cores): the front end and NVVM run once, only ptxas runs per SM.
// Kernels are chosen for the oldest SM anyway (OpOptions::min_target_sm),
// and no generated source branches on __CUDA_ARCH__, so each cubin is the
// code an sm_XX NVRTC compile would run. Results are kept in an in-process
// cache keyed by (arch, module name, source), so a partition compiled again
// (a trial compile re-proposed, kiln.save re-lowering) costs nothing, and,
// when KILN_KERNEL_CACHE names a folder, on disk across processes
// (kernel_disk_cache.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::codegen {

// Builds a cubin for each SM in `target_sms` (exactly those; which SMs an
// engine covers with them is the compiler's business, CompileOptions).
// Throws CompileError with NVRTC's (or nvJitLink's) log when compilation
// fails. `progress`, when set, is called on the calling thread as each SM
// finishes (from threads it is never called). With `emit_ptx` the module
// carries the PTX, ptx_sm = the oldest target SM. With `grid_dependency`
// the cubins for sm_90 and newer wait for the previous kernel in-kernel and
// may be launched early (grid_dependency.h); the kept PTX does not.
engine::KernelModule compile_module(const std::string& name, const std::string& source,
                                    const std::vector<uint32_t>& target_sms, bool emit_ptx,
                                    const std::function<void(const std::string&)>& progress = {},
                                    bool grid_dependency = false);

// compile_module for several modules at once: their NVRTC compiles run in
// parallel, then all their cubins (the same threads: KILN_NVRTC_THREADS,
// else one per core). An engine's kernels split over a few modules so that
// a 2-core machine compiles them in about half the time (split_modules in
// compiler/compiler.cpp).
struct ModuleSource {
  std::string name;
  std::string source;
};
std::vector<engine::KernelModule> compile_modules(const std::vector<ModuleSource>& sources,
                                                  const std::vector<uint32_t>& target_sms, bool emit_ptx,
                                                  const std::function<void(const std::string&)>& progress = {},
                                                  bool grid_dependency = false);

// NVRTC's version as "major.minor", for engine metadata.
std::string nvrtc_version();

// The in-process cache, for tests and diagnostics.
struct NvrtcCacheStats {
  uint64_t compiles = 0;   // NVRTC programs compiled (one PTX per module and oldest SM)
  uint64_t assembles = 0;  // cubins assembled from PTX by nvJitLink (one per SM)
  uint64_t hits = 0;       // PTX or cubins served from the cache
  uint64_t disk_hits = 0;    // PTX or cubins read from the on-disk cache (KILN_KERNEL_CACHE)
  uint64_t disk_writes = 0;  // PTX or cubins written to it
  uint64_t entries = 0;
  uint64_t bytes = 0;
  double seconds = 0;  // wall time spent in compile_module, hits included
};
NvrtcCacheStats nvrtc_cache_stats();
void clear_nvrtc_cache();

}  // namespace kiln::codegen
