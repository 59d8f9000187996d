// Compiles generated CUDA source with NVRTC at export time: a cubin for each
// target SM plus PTX for the newest, so no GPU is needed to build an engine.
//
// Export time: the SMs compile in parallel threads; the PTX is the one NVRTC
// produced on the way to the newest SM's cubin (the same bytes a separate
// compute_XX compile gives, without compiling a third time); and results
// are kept in an in-process cache keyed by (module name, source, arch), so a
// partition compiled again (a trial compile re-proposed, kiln.save
// re-lowering) costs no NVRTC time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::codegen {

// Throws CompileError with NVRTC's log when compilation fails. `progress`,
// when set, is called on the calling thread as each SM finishes (from
// threads it is never called).
engine::KernelModule compile_module(const std::string& name, const std::string& source,
                                    const std::vector<uint32_t>& target_sms, bool emit_ptx,
                                    const std::function<void(const std::string&)>& progress = {});

// NVRTC's version as "major.minor", for engine metadata.
std::string nvrtc_version();

// The in-process cache, for tests and diagnostics.
struct NvrtcCacheStats {
  uint64_t compiles = 0;  // NVRTC programs compiled (one per SM, plus any PTX-only compile)
  uint64_t hits = 0;      // (source, arch) pairs served from the cache
  uint64_t entries = 0;
  uint64_t bytes = 0;
};
NvrtcCacheStats nvrtc_cache_stats();
void clear_nvrtc_cache();

// PTX from a compute_<sm> compile of `source`: what compile_module did for
// the PTX before it reused the newest SM's compile (kept for the test that
// the two agree, and as the fallback when NVRTC hands back no PTX).
std::string compile_ptx_only(const std::string& name, const std::string& source, uint32_t sm);

}  // namespace kiln::codegen
