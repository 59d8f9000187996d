// Index inputs and the values they may hold. An engine input that an op reads as indices
// (embedding rows, a KV cache's positions) is recorded with the range PyTorch accepts for it;
// PyTorch raises outside that range, while Kiln's kernels clamp (they must not read or write out
// of bounds), which would be a silent wrong answer. The runtime checks host-resident index
// inputs against their range before any launch (device-resident ones are not read on the host).
//
// Stored in the engine's metadata under kInputBoundsKey, one bound a line:
//   "<input> <lo> <hi> <what>\n"   values v with lo <= v < hi; `what` names what is indexed
// so engines without the key (older exports) simply have no checks. No CUDA here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::engine {

constexpr const char* kInputBoundsKey = "input_bounds";

struct InputBound {
  uint32_t input = 0;   // engine input number
  int64_t lo = 0, hi = 0;
  std::string what;     // what it indexes, e.g. "dim 2 (size 768) of state 'k_cache_0'"
};

// The metadata value for `bounds` (what must be one line of printable text).
std::string format_input_bounds(const std::vector<InputBound>& bounds);

// Parses a metadata value; kCorruptData names the line that is malformed, names an input
// outside [0, num_inputs), or has lo >= hi.
Result<std::vector<InputBound>> parse_input_bounds(const std::string& text, size_t num_inputs);

// Checks the `nbytes` bytes at `data`, input `name`'s host values of `dtype` (int64 or int32),
// against `bound`: kInvalidArgument naming the input, the first bad element, its value, what it
// indexes and the range. Another dtype is kInvalidArgument too (the compiler records only those).
Status check_index_values(const InputBound& bound, DType dtype, const void* data, size_t nbytes,
                          const std::string& name);

}  // namespace kiln::engine
