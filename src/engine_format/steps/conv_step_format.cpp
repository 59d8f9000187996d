// Conv steps (ConvStep in engine_desc.h), format side: payload codec,
// validator, inspect fields and one-line summary. The runtime half is
// runtime/steps/conv_step_exec.cpp.
//
// Payload: u32 x, w, bias, z, out; i64 n, h, w_in, c, k, r, s, p, q, pad_h,
//          pad_w, stride_h, stride_w, dilation_h, dilation_w, groups;
//          u8 activation
//
// Validation: every field comes from a possibly hostile file, so arithmetic
// is overflow-checked and nothing is indexed before its range is known; the
// runtime then hands the extents to cuDNN without further checks.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_validate_internal.h"
#include "engine_format/step_format.h"

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

const char* activation_name(ConvActivation activation) {
  switch (activation) {
    case ConvActivation::kNone: return "none";
    case ConvActivation::kRelu: return "relu";
  }
  return "unknown";
}

void write(const Step& s, ByteWriter* w) {
  const ConvStep& c = s.conv;
  for (uint32_t t : {c.x, c.w, c.bias, c.z, c.out}) w->put_u32(t);
  for (int64_t v : {c.n, c.h, c.w_in, c.c, c.k, c.r, c.s, c.p, c.q, c.pad_h, c.pad_w,
                    c.stride_h, c.stride_w, c.dilation_h, c.dilation_w, c.groups})
    w->put_i64(v);
  w->put_u8(static_cast<uint8_t>(c.activation));
}

Status read(ByteReader& r, uint32_t i, Step* s) {
  ConvStep* c = &s->conv;
  const std::pair<const char*, uint32_t*> tensors[] = {
      {"x", &c->x}, {"w", &c->w}, {"bias", &c->bias}, {"z", &c->z}, {"out", &c->out}};
  for (const auto& t : tensors)
    KILN_READ_OR_RETURN(r.read_u32(t.second), "step %u conv %s", i, t.first);
  const std::pair<const char*, int64_t*> fields[] = {
      {"n", &c->n},           {"h", &c->h},           {"w_in", &c->w_in},
      {"c", &c->c},           {"k", &c->k},           {"r", &c->r},
      {"s", &c->s},           {"p", &c->p},           {"q", &c->q},
      {"pad_h", &c->pad_h},   {"pad_w", &c->pad_w},   {"stride_h", &c->stride_h},
      {"stride_w", &c->stride_w}, {"dilation_h", &c->dilation_h},
      {"dilation_w", &c->dilation_w}, {"groups", &c->groups}};
  for (const auto& f : fields)
    KILN_READ_OR_RETURN(r.read_i64(f.second), "step %u conv %s", i, f.first);
  uint8_t activation = 0;
  KILN_READ_OR_RETURN(r.read_u8(&activation), "step %u conv activation", i);
  // Range-checked by validate, like the GEMM epilogue.
  c->activation = static_cast<ConvActivation>(activation);
  return Status::ok();
}

Status validate(const StepCheck& check) {
  const EngineDesc& desc = check.desc();
  const std::string& label = check.label();
  const ConvStep& c = check.step().conv;
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

  // Shapes, NHWC / KRSC: exact for the filter and bias; the activations
  // (x, z, out) may be stored under a shape that differs only in dims of
  // size 1, as when x is a view of an engine input (a [1, 4000] waveform read
  // as [1, 1, 4000, 1]): the same elements in the same order. A permuted
  // shape (NCHW for NHWC) is still refused.
  struct Expected {
    const char* role;
    uint32_t tensor;
    std::vector<int64_t> shape;
    bool activation;
  };
  const Expected expected[] = {
      {"x", c.x, {c.n, c.h, c.w_in, c.c}, true},
      {"w", c.w, {c.k, c.r, c.s, c.c / c.groups}, false},
      {"bias", c.bias, {c.k}, false},
      {"z", c.z, {c.n, c.p, c.q, c.k}, true},
      {"out", c.out, {c.n, c.p, c.q, c.k}, true},
  };
  auto squeezed = [](const std::vector<int64_t>& shape) {
    std::vector<int64_t> s;
    for (int64_t d : shape)
      if (d != 1) s.push_back(d);
    return s;
  };
  const DType dtype = desc.tensors[c.x].dtype;
  if (!is_float(dtype))
    return invalid("%s: conv x tensor %u '%s' is %s; convs take float32, float16 or bfloat16",
                   l, c.x, desc.tensors[c.x].name.c_str(), dtype_name(dtype));
  for (const Expected& e : expected) {
    if (e.tensor == kNoTensor) continue;
    const TensorDesc& t = desc.tensors[e.tensor];
    if (e.activation ? squeezed(t.shape) != squeezed(e.shape) : t.shape != e.shape)
      return invalid("%s: conv %s tensor %u '%s' has shape %s, expected %s%s", l, e.role, e.tensor,
                     t.name.c_str(), shape_text(t.shape).c_str(), shape_text(e.shape).c_str(),
                     e.activation ? " (or one that differs only in dims of size 1)" : "");
    if (t.dtype != dtype)
      return invalid("%s: conv %s tensor %u '%s' is %s but x is %s", l, e.role, e.tensor,
                     t.name.c_str(), dtype_name(t.dtype), dtype_name(dtype));
  }

  if (is_weight(desc.tensors[c.out].storage))
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

// "8x56x56x64 -> 8x56x56x128, 3x3 s1x1 p1x1 d1x1 g1 +bias +z relu": one line
// for `kiln inspect`, so the Python side needs no conv-specific formatting.
std::string inspect_summary(const ConvStep& c) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "%lldx%lldx%lldx%lld -> %lldx%lldx%lldx%lld (NHWC), %lldx%lld s%lldx%lld "
                "p%lldx%lld d%lldx%lld g%lld%s%s %s",
                static_cast<long long>(c.n), static_cast<long long>(c.h),
                static_cast<long long>(c.w_in), static_cast<long long>(c.c),
                static_cast<long long>(c.n), static_cast<long long>(c.p),
                static_cast<long long>(c.q), static_cast<long long>(c.k),
                static_cast<long long>(c.r), static_cast<long long>(c.s),
                static_cast<long long>(c.stride_h), static_cast<long long>(c.stride_w),
                static_cast<long long>(c.pad_h), static_cast<long long>(c.pad_w),
                static_cast<long long>(c.dilation_h), static_cast<long long>(c.dilation_w),
                static_cast<long long>(c.groups), c.bias != kNoTensor ? " +bias" : "",
                c.z != kNoTensor ? " +z" : "", activation_name(c.activation));
  return text;
}

void describe(const Step& s, StepFieldSink& out) {
  const ConvStep& c = s.conv;
  out.text("summary", inspect_summary(c));
  out.integers("input_shape", {c.n, c.h, c.w_in, c.c});
  out.integers("output_shape", {c.n, c.p, c.q, c.k});
  out.integers("filter", {c.r, c.s});
  out.integers("stride", {c.stride_h, c.stride_w});
  out.integers("padding", {c.pad_h, c.pad_w});
  out.integers("dilation", {c.dilation_h, c.dilation_w});
  out.integer("groups", c.groups);
  out.text("activation", activation_name(c.activation));
  out.tensor("x", c.x);
  out.tensor("w", c.w);
  out.tensor("bias", c.bias);
  out.tensor("z", c.z);
  out.tensor("out", c.out);
}

std::string summary(const EngineDesc& desc, const Step& s) {
  const ConvStep& c = s.conv;
  char text[192];
  std::snprintf(text, sizeof(text), "conv %s %lldx%lldx%lldx%lld -> %lld, %lldx%lld s%lld g%lld",
                dtype_name(desc.tensors[c.x].dtype), static_cast<long long>(c.n),
                static_cast<long long>(c.h), static_cast<long long>(c.w_in),
                static_cast<long long>(c.c), static_cast<long long>(c.k),
                static_cast<long long>(c.r), static_cast<long long>(c.s),
                static_cast<long long>(c.stride_h), static_cast<long long>(c.groups));
  return text;
}

}  // namespace

extern const StepFormat kConvStepFormat = {StepKind::kConv, "conv", write, read, validate,
                                           describe, summary};

}  // namespace kiln::engine
