// Checks kiln_runner makes on a program before ExecuTorch acts on what it
// says. Shared with the CPU fuzz harness (tests/fuzz/), which drives the same
// load path over damaged files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// The flatbuffer part of a .pte (the extended header's program_size bytes,
// else the whole file); empty when the file cannot be read.
std::vector<uint8_t> read_program_flatbuffer(const std::string& path);

// Where a tensor of a method's signature lives, as the program records it
// (ExecuTorch's Tensor.extra_tensor_info: set for device-resident I/O,
// kiln.save with the device-resident config). `type` is ExecuTorch's
// DeviceType: 0 CPU, 1 CUDA; a tensor without the field is on the CPU.
struct IoDevice {
  uint8_t type = 0;
  int8_t index = 0;
};

// Fills one IoDevice per input and output of method `method` (non-tensor
// values read as CPU). "" on success, otherwise what is wrong. Bounds-checked
// like check_delegate_tables, so it is safe on any bytes.
std::string read_io_devices(const uint8_t* data, size_t size, const std::string& method,
                            std::vector<IoDevice>* inputs, std::vector<IoDevice>* outputs);

// Module::load_method allocates (and zero-fills) each memory-planned buffer at
// the size the file states, with std::vector: a damaged size throws
// std::bad_alloc out of ExecuTorch (the process aborts) or takes all memory.
// Returns "" when every size is non-negative and their sum is at most
// `limit_bytes`, otherwise what is wrong (naming the buffer).
std::string check_planned_memory(const executorch::runtime::MethodMeta& meta,
                                 uint64_t limit_bytes);

// An input may be smaller than the shape the program plans for it: a
// program exported with dynamic shapes plans each input at its largest size
// (ExecuTorch refuses to resize a static input; the Kiln delegate names a
// size it has no engine for). True when `given` has the planned rank and
// every dim is in [0, planned].
bool fits_planned_shape(const int64_t* given, size_t rank, const std::vector<int64_t>& planned);

// The limit kiln_runner uses: the machine's physical memory.
uint64_t physical_memory_bytes();

}  // namespace kiln::tools
