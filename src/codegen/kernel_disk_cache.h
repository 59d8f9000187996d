// The on-disk kernel cache: NVRTC's PTX and nvJitLink's cubins kept across
// processes in the folder KILN_KERNEL_CACHE names (off when unset or
// empty), so exporting a model again, or another model with the same
// kernels, skips their compiles. Entries are named by the SHA-256 of
// everything the artifact was built from (NVRTC and nvJitLink versions,
// what was built: PTX compute_XX or cubin sm_XX from it, the compile
// options, the module name and the full source), so a changed source or
// toolkit is a miss, never a stale hit. The engine bytes do not depend on
// the cache (a hit is the bytes a compile would give): it is a speed knob,
// hence an environment variable and not an option recorded in the engine.
//
// Each entry is one file, written to a temporary name and renamed into
// place (two exports sharing the folder never see a half-written entry),
// holding a magic, the payload size and its CRC-32C; an entry that fails
// those checks is a miss and is written again. Nothing is ever evicted:
// delete the folder to empty it. Errors reading or writing the folder are
// not export errors: the artifact is compiled and the cache skipped.
#pragma once

#include <optional>
#include <string>

namespace kiln::codegen {

// The folder from KILN_KERNEL_CACHE; "" when the cache is off.
std::string kernel_cache_dir();

// The entry name for an artifact (`what`: e.g. "ptx compute_80" or
// "cubin sm_90<compute_80"): 64 hex digits.
std::string kernel_cache_key(const std::string& what, const std::string& name, const std::string& source);

// The payload stored under `key` in `dir`; nullopt when absent or damaged.
std::optional<std::string> kernel_cache_read(const std::string& dir, const std::string& key);

// Stores `payload` under `key` (creating `dir`); false when it could not.
bool kernel_cache_write(const std::string& dir, const std::string& key, const std::string& payload);

}  // namespace kiln::codegen
