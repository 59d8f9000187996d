// Compiles generated CUDA source with NVRTC at export time: a cubin for each
// target SM plus PTX for the newest, so no GPU is needed to build an engine.
#pragma once

#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::codegen {

// Throws CompileError with NVRTC's log when compilation fails.
engine::KernelModule compile_module(const std::string& name, const std::string& source,
                                    const std::vector<uint32_t>& target_sms, bool emit_ptx);

// NVRTC's version as "major.minor", for engine metadata.
std::string nvrtc_version();

}  // namespace kiln::codegen
