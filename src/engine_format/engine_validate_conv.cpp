// validate_engine's rules for conv steps (ConvStep in engine_desc.h). Every
// field comes from a possibly hostile file, so arithmetic is overflow-checked
// and nothing is indexed before its range is known; the runtime then hands
// the extents to cuDNN without further checks.
#include <cstdint>
#include <string>
#include <vector>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_validate_internal.h"

namespace kiln::engine {
namespace {

bool is_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(shape[d]);
  }
  return text + "]";
}

// The byte range a tensor occupies, for alias checks: only arena tensors can
// share memory with a different tensor (inputs, outputs and weights each
// have their own place).
bool overlaps(const EngineDesc& desc, uint32_t a, uint32_t b) {
  if (a == b) return true;
  const TensorDesc& x = desc.tensors[a];
  const TensorDesc& y = desc.tensors[b];
  if (x.storage != StorageKind::kArena || y.storage != StorageKind::kArena) return false;
  if (x.nbytes == 0 || y.nbytes == 0) return false;
  // Validated already: offset + nbytes does not overflow.
  return x.offset < y.offset + y.nbytes && y.offset < x.offset + x.nbytes;
}

bool same_range(const EngineDesc& desc, uint32_t a, uint32_t b) {
  if (a == b) return true;
  const TensorDesc& x = desc.tensors[a];
  const TensorDesc& y = desc.tensors[b];
  return x.storage == StorageKind::kArena && y.storage == StorageKind::kArena &&
         x.offset == y.offset && x.nbytes == y.nbytes;
}

// (in + 2*pad - dilation*(filter-1) - 1) / stride + 1, or an error naming
// the axis when it overflows or the dilated filter exceeds the padded input.
Status output_extent(const std::string& label, const char* axis, int64_t in, int64_t filter,
                     int64_t pad, int64_t stride, int64_t dilation, int64_t* out) {
  int64_t two_pad = 0, padded = 0, reach = 0;
  if (!checked_mul(int64_t{2}, pad, &two_pad) || __builtin_add_overflow(in, two_pad, &padded) ||
      !checked_mul(dilation, filter - 1, &reach) || __builtin_add_overflow(reach, 1, &reach))
    return invalid("%s: conv %s extent overflows int64", label.c_str(), axis);
  if (padded < reach)
    return invalid("%s: conv dilated filter %s %lld is larger than the padded input %lld",
                   label.c_str(), axis, static_cast<long long>(reach),
                   static_cast<long long>(padded));
  *out = (padded - reach) / stride + 1;
  return Status::ok();
}

}  // namespace

Status check_conv(const EngineDesc& desc, uint32_t step, const std::string& label) {
  const ConvStep& c = desc.steps[step].conv;
  const char* l = label.c_str();
  if (static_cast<uint8_t>(c.activation) > static_cast<uint8_t>(ConvActivation::kRelu))
    return invalid("%s: conv activation %u out of range", l,
                   static_cast<unsigned>(c.activation));

  // Tensor references first: everything below reads the tensors.
  const std::pair<const char*, uint32_t> refs[] = {
      {"x", c.x}, {"w", c.w}, {"bias", c.bias}, {"z", c.z}, {"out", c.out}};
  for (const auto& ref : refs) {
    const bool optional = ref.first[0] == 'b' || ref.first[0] == 'z';
    if (optional && ref.second == kNoTensor) continue;
    if (ref.second >= desc.tensors.size())
      return invalid("%s: conv %s tensor %u out of range (engine has %zu tensors)", l, ref.first,
                     ref.second, desc.tensors.size());
  }

  const std::pair<const char*, int64_t> extents[] = {
      {"n", c.n}, {"h", c.h}, {"w_in", c.w_in}, {"c", c.c}, {"k", c.k},
      {"r", c.r}, {"s", c.s}, {"p", c.p},       {"q", c.q}, {"groups", c.groups}};
  for (const auto& e : extents)
    if (e.second <= 0)
      return invalid("%s: conv %s is %lld, must be positive", l, e.first,
                     static_cast<long long>(e.second));
  if (c.stride_h <= 0 || c.stride_w <= 0)
    return invalid("%s: conv stride %lldx%lld must be positive", l,
                   static_cast<long long>(c.stride_h), static_cast<long long>(c.stride_w));
  if (c.dilation_h <= 0 || c.dilation_w <= 0)
    return invalid("%s: conv dilation %lldx%lld must be positive", l,
                   static_cast<long long>(c.dilation_h), static_cast<long long>(c.dilation_w));
  if (c.pad_h < 0 || c.pad_w < 0)
    return invalid("%s: conv padding %lldx%lld must not be negative", l,
                   static_cast<long long>(c.pad_h), static_cast<long long>(c.pad_w));
  if (c.c % c.groups != 0 || c.k % c.groups != 0)
    return invalid("%s: conv groups %lld must divide both c=%lld and k=%lld", l,
                   static_cast<long long>(c.groups), static_cast<long long>(c.c),
                   static_cast<long long>(c.k));

  int64_t p = 0, q = 0;
  KILN_RETURN_IF_ERROR(output_extent(label, "height", c.h, c.r, c.pad_h, c.stride_h,
                                     c.dilation_h, &p));
  KILN_RETURN_IF_ERROR(output_extent(label, "width", c.w_in, c.s, c.pad_w, c.stride_w,
                                     c.dilation_w, &q));
  if (p != c.p || q != c.q)
    return invalid("%s: conv output %lldx%lld does not match the input, filter, padding, "
                   "stride and dilation, which give %lldx%lld",
                   l, static_cast<long long>(c.p), static_cast<long long>(c.q),
                   static_cast<long long>(p), static_cast<long long>(q));

  // Exact shapes, NHWC / KRSC.
  struct Expected {
    const char* role;
    uint32_t tensor;
    std::vector<int64_t> shape;
  };
  const Expected expected[] = {
      {"x", c.x, {c.n, c.h, c.w_in, c.c}},
      {"w", c.w, {c.k, c.r, c.s, c.c / c.groups}},
      {"bias", c.bias, {c.k}},
      {"z", c.z, {c.n, c.p, c.q, c.k}},
      {"out", c.out, {c.n, c.p, c.q, c.k}},
  };
  const DType dtype = desc.tensors[c.x].dtype;
  if (!is_float(dtype))
    return invalid("%s: conv x tensor %u '%s' is %s; convs take float32, float16 or bfloat16",
                   l, c.x, desc.tensors[c.x].name.c_str(), dtype_name(dtype));
  for (const Expected& e : expected) {
    if (e.tensor == kNoTensor) continue;
    const TensorDesc& t = desc.tensors[e.tensor];
    if (t.shape != e.shape)
      return invalid("%s: conv %s tensor %u '%s' has shape %s, expected %s", l, e.role, e.tensor,
                     t.name.c_str(), shape_text(t.shape).c_str(), shape_text(e.shape).c_str());
    if (t.dtype != dtype)
      return invalid("%s: conv %s tensor %u '%s' is %s but x is %s", l, e.role, e.tensor,
                     t.name.c_str(), dtype_name(t.dtype), dtype_name(dtype));
  }

  if (desc.tensors[c.out].storage == StorageKind::kWeight)
    return invalid("%s: conv out tensor %u '%s' is a weight", l, c.out,
                   desc.tensors[c.out].name.c_str());
  // cuDNN reads x, w and bias while it writes out: they must not share
  // memory. z may be out itself (residual added in place) or apart from it.
  const std::pair<const char*, uint32_t> reads[] = {{"x", c.x}, {"w", c.w}, {"bias", c.bias}};
  for (const auto& r : reads)
    if (r.second != kNoTensor && overlaps(desc, r.second, c.out))
      return invalid("%s: conv %s tensor %u overlaps out tensor %u in memory", l, r.first,
                     r.second, c.out);
  if (c.z != kNoTensor && overlaps(desc, c.z, c.out) && !same_range(desc, c.z, c.out))
    return invalid("%s: conv z tensor %u partly overlaps out tensor %u (it must be the same "
                   "memory or separate)",
                   l, c.z, c.out);
  return Status::ok();
}

}  // namespace kiln::engine
