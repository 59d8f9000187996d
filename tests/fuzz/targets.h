// What the fuzz harness pushes mutated bytes through.
//
// .pte files: kiln_runner's load path (ExecuTorch's Module over the bytes,
// load with kProgramVerification, method names, every field of each method's
// meta, the planned-memory check, load_method). Method loading runs until the
// delegates' init: a stand-in "KilnBackend" registered by this harness takes
// the delegate blob and runs what the real delegate runs first on it
// (kiln::engine::parse_engine + validate_engine) and stops there, as no GPU is
// needed for that part. ExecuTorch then resolves the CPU kernels
// (kernels_optimized) of ops outside the delegates.
//
// Engine blobs: kiln::engine::parse_engine + validate_engine, on raw
// mutations (mostly caught by the checksums) and on mutations whose checksums
// are re-computed afterwards ("re-sealed"), which reach the field checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mutate.h"

namespace kiln::fuzz {

enum class Outcome { kAccepted, kRefused };

// Registers the stand-in KilnBackend with ExecuTorch (once) and silences
// ExecuTorch's log unless `verbose`.
void init_targets(bool verbose);

// Runs the load path over `size` bytes. `captured_blobs`, when given,
// receives a copy of each delegate blob the stand-in backend is handed.
Outcome run_pte(const uint8_t* data, size_t size, std::vector<std::vector<uint8_t>>* captured_blobs);

// parse_engine + validate_engine.
Outcome run_engine(const uint8_t* data, size_t size);

// Where a .pte's flatbuffer ends (its extended header's program_size), for
// Focus; 0 when the header cannot be read.
size_t pte_program_size(const uint8_t* data, size_t size);

// The byte ranges of an intact engine's sections, in table order (all six,
// weights last), for Focus.
std::vector<Focus> engine_sections(const std::vector<uint8_t>& engine);

// Re-computes every section checksum whose range lies inside `engine`, then
// the header checksum, so the mutation reaches the field checks.
void reseal_engine(std::vector<uint8_t>* engine);

}  // namespace kiln::fuzz
