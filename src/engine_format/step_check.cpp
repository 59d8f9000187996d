// StepCheck: the shared measuring helpers step validators use
// (steps/<kind>_step_format.cpp). Arithmetic is overflow-checked: every
// number may come from a hostile file.
#include <string>

#include "engine_format/byte_io.h"
#include "engine_format/engine_validate_internal.h"
#include "engine_format/step_format.h"

namespace kiln::engine {

namespace {

std::string shape_label(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

std::string StepCheck::tensor_label(uint32_t t) const {
  return "tensor " + std::to_string(t) + " '" + desc_.tensors[t].name + "'";
}

Status StepCheck::tensor_ref(const char* role, uint32_t index) const {
  if (index >= desc_.tensors.size())
    return invalid("%s: %s tensor %u out of range (engine has %zu tensors)", label_.c_str(), role,
                   index, desc_.tensors.size());
  return Status::ok();
}

Status StepCheck::matrix(const char* role, uint32_t index, int64_t rows, int64_t cols) const {
  int64_t expected = 0;
  if (!checked_mul(rows, cols, &expected))
    return invalid("%s: %s element count overflows int64", label_.c_str(), role);
  if (numel_[index] != expected)
    return invalid("%s: %s %s has %lld elements, expected [%lld, %lld]", label_.c_str(), role,
                   tensor_label(index).c_str(), static_cast<long long>(numel_[index]),
                   static_cast<long long>(rows), static_cast<long long>(cols));
  return row_boundary(role, index, cols);
}

Status StepCheck::row_boundary(const char* role, uint32_t index, int64_t cols) const {
  const TensorDesc& t = desc_.tensors[index];
  int64_t suffix = 1;
  // A row of one element never crosses a dim: any tensor splits into such rows
  // (a bmm whose b is a vector a batch, stored with other trailing dims).
  if (cols == 1) return Status::ok();
  for (size_t d = t.shape.size(); d-- > 0;) {
    suffix *= t.shape[d];
    if (suffix == cols) return Status::ok();
    if (suffix > cols || suffix == 0) break;
  }
  return invalid("%s: %s %s of shape %s does not split into rows of %lld elements", label_.c_str(), role,
                 tensor_label(index).c_str(), shape_label(t.shape).c_str(), static_cast<long long>(cols));
}

Status StepCheck::batched_matrix(const char* role, uint32_t index, int64_t rows, int64_t cols,
                                 int64_t batch, int64_t stride) const {
  if (batch == 1) return matrix(role, index, rows, cols);
  int64_t one = 0, offset = 0, span = 0;
  if (!checked_mul(rows, cols, &one) || !checked_mul(batch - 1, stride, &offset) ||
      __builtin_add_overflow(offset, one, &span))
    return invalid("%s: %s extent (batch %lld, stride %lld) overflows int64", label_.c_str(),
                   role, static_cast<long long>(batch), static_cast<long long>(stride));
  if (span > numel_[index])
    return invalid("%s: %s %s has %lld elements, but %lld matrices of [%lld, %lld] %lld "
                   "elements apart reach %lld",
                   label_.c_str(), role, tensor_label(index).c_str(),
                   static_cast<long long>(numel_[index]), static_cast<long long>(batch),
                   static_cast<long long>(rows), static_cast<long long>(cols),
                   static_cast<long long>(stride), static_cast<long long>(span));
  return row_boundary(role, index, cols);
}

}  // namespace kiln::engine
