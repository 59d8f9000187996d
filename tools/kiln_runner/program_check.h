// Checks kiln_runner makes on a program before ExecuTorch acts on what it
// says. Shared with the CPU fuzz harness (tests/fuzz/), which drives the same
// load path over damaged files.
#pragma once

#include <cstdint>
#include <string>

#include <executorch/runtime/executor/method_meta.h>
#include <executorch/runtime/executor/program.h>

namespace kiln::tools {

// How kiln_runner loads programs: ExecuTorch checks every flatbuffer offset
// and length before use. The default, Minimal, checks only the file header, and
// a damaged file then crashes the process in method_meta() or load_method()
// (issue 13; docs/reliability.md gives the cost).
constexpr executorch::runtime::Program::Verification kProgramVerification =
    executorch::runtime::Program::Verification::InternalConsistency;

// ExecuTorch's verifier accepts a flatbuffer whose optional fields are
// absent (a valid flatbuffer), but Method::init then reads some of them
// without a null check and crashes: a delegate's id, `processed` reference and
// compile-spec list, and each compile spec's key and value; and
// Module::method_names() aborts on a method without a name (found by the fuzz
// harness: one damaged vtable offset is enough). Returns "" when every
// method has a name and every delegate has those fields, otherwise what is
// missing. Every read is
// bounds-checked against `size`, so it is safe on any bytes.
std::string check_delegate_tables(const uint8_t* data, size_t size);

// The same for a file: reads its flatbuffer part (the extended header's
// program_size, else the whole file). "" when fine or when the file cannot be
// read (ExecuTorch then says why).
std::string check_delegate_tables_in_file(const std::string& path);

// Module::load_method allocates (and zero-fills) each memory-planned buffer at
// the size the file states, with std::vector: a damaged size throws
// std::bad_alloc out of ExecuTorch (the process aborts) or takes all memory.
// Returns "" when every size is non-negative and their sum is at most
// `limit_bytes`, otherwise what is wrong (naming the buffer).
std::string check_planned_memory(const executorch::runtime::MethodMeta& meta,
                                 uint64_t limit_bytes);

// The limit kiln_runner uses: the machine's physical memory.
uint64_t physical_memory_bytes();

}  // namespace kiln::tools
