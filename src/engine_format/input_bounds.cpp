#include "engine_format/input_bounds.h"

#include <cinttypes>
#include <cstring>
#include <sstream>

namespace kiln::engine {

std::string format_input_bounds(const std::vector<InputBound>& bounds) {
  std::ostringstream s;
  for (const InputBound& b : bounds) s << b.input << ' ' << b.lo << ' ' << b.hi << ' ' << b.what << '\n';
  return s.str();
}

Result<std::vector<InputBound>> parse_input_bounds(const std::string& text, size_t num_inputs) {
  std::vector<InputBound> bounds;
  std::istringstream lines(text);
  std::string line;
  for (size_t n = 1; std::getline(lines, line); ++n) {
    std::istringstream in(line);
    long long input = -1, lo = 0, hi = 0;
    InputBound b;
    if (!(in >> input >> lo >> hi) || in.get() != ' ' || !std::getline(in, b.what) || b.what.empty())
      return make_status(StatusCode::kCorruptData, "%s line %zu '%s': expected '<input> <lo> <hi> <what>'",
                         kInputBoundsKey, n, line.c_str());
    if (input < 0 || static_cast<unsigned long long>(input) >= num_inputs || lo >= hi)
      return make_status(StatusCode::kCorruptData,
                         "%s line %zu: input %lld of %zu, range [%lld, %lld): not an input, or an empty range",
                         kInputBoundsKey, n, input, num_inputs, lo, hi);
    b.input = static_cast<uint32_t>(input);
    b.lo = lo;
    b.hi = hi;
    bounds.push_back(std::move(b));
  }
  return bounds;
}

Status check_index_values(const InputBound& bound, DType dtype, const void* data, size_t nbytes,
                          const std::string& name) {
  if (dtype != DType::kInt64 && dtype != DType::kInt32)
    return make_status(StatusCode::kInvalidArgument, "input %u ('%s') is %s; an index input is int64 or int32",
                       bound.input, name.c_str(), dtype_name(dtype));
  const size_t size = dtype == DType::kInt64 ? 8 : 4, count = nbytes / size;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < count; ++i) {
    int64_t v;
    if (size == 8) {
      std::memcpy(&v, bytes + i * 8, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, bytes + i * 4, 4);
      v = v32;
    }
    if (v < bound.lo || v >= bound.hi)
      return make_status(StatusCode::kInvalidArgument,
                         "input %u ('%s'): element %zu is %" PRId64 ", outside [%" PRId64 ", %" PRId64
                         "): it indexes %s",
                         bound.input, name.c_str(), i, v, bound.lo, bound.hi, bound.what.c_str());
  }
  return Status::ok();
}

}  // namespace kiln::engine
