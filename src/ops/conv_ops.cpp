#include "ops/conv_ops.h"

#include <variant>

namespace kiln::ops {
namespace {

// Two values from an int list attribute of length 1 or 2 (PyTorch repeats a
// single value); empty for anything else.
bool pair_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key, std::array<int64_t, 2>& out) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return true;
  if (auto* i = std::get_if<int64_t>(&it->second)) {
    out = {*i, *i};
    return true;
  }
  auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  if (!v || v->empty() || v->size() > 2) return false;
  out = {(*v)[0], v->size() == 2 ? (*v)[1] : (*v)[0]};
  return true;
}

bool bool_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key, bool fallback) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  if (auto* i = std::get_if<int64_t>(&it->second)) return *i != 0;
  return fallback;
}

}  // namespace

bool is_conv_op(const std::string& op) { return op == "aten.convolution.default" || op == "aten.conv2d.default"; }

bool is_batch_norm_op(const std::string& op) { return op == kBatchNorm; }

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

std::string check_conv(const compiler::OpQuery& q) {
  if (q.inputs.size() < 2 || q.inputs.size() > 3 || q.outputs.size() != 1)
    return "convolution needs an input, a weight, an optional bias and one output";
  if (bool_attr(q.attrs, "transposed", false)) return "transposed convolution is not supported";
  const auto& x = q.inputs[0].shape;
  const auto& w = q.inputs[1].shape;
  if (x.size() != 4 || w.size() != 4)
    return "only 2-D convolutions with a 4-D [n, c, h, w] input are supported (input is " + ir::shape_to_string(x) +
           ")";
  if (!q.inputs[1].is_constant) return "convolution weights must be constant (parameters), not computed";
  if (q.inputs.size() == 3 && (!q.inputs[2].is_constant || q.inputs[2].shape.size() != 1))
    return "convolution bias must be a constant 1-D tensor";
  for (const auto& t : q.inputs)
    if (t.dtype != q.inputs[0].dtype) return "convolution operands have different dtypes";
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  if (!pair_attr(q.attrs, "stride", stride) || !pair_attr(q.attrs, "padding", padding) ||
      !pair_attr(q.attrs, "dilation", dilation))
    return "convolution stride/padding/dilation must be lists of one or two integers";
  for (int i = 0; i < 2; ++i) {
    if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0)
      return "convolution needs stride >= 1, dilation >= 1 and padding >= 0";
  }
  auto it = q.attrs.find("groups");
  int64_t groups = 1;
  if (it != q.attrs.end()) {
    auto* g = std::get_if<int64_t>(&it->second);
    if (!g) return "convolution groups must be an integer";
    groups = *g;
  }
  if (groups < 1 || x[1] % groups != 0 || w[0] % groups != 0 || w[1] * groups != x[1])
    return "convolution groups=" + std::to_string(groups) + " does not match input channels " + std::to_string(x[1]) +
           " and weight " + ir::shape_to_string(w);
  if (q.inputs.size() == 3 && q.inputs[2].shape[0] != w[0]) return "convolution bias size does not match the weight";
  return "";
}

std::string check_batch_norm(const compiler::OpQuery& q) {
  if (q.inputs.size() != 5)
    return "batch norm without an affine weight and bias is not supported";
  const auto& x = q.inputs[0].shape;
  if (x.size() < 2) return "batch norm needs an input of rank 2 or more";
  for (size_t i = 1; i < 5; ++i) {
    if (!q.inputs[i].is_constant) return "batch norm parameters and running statistics must be constant";
    if (q.inputs[i].shape.size() != 1 || q.inputs[i].shape[0] != x[1])
      return "batch norm parameter " + std::to_string(i) + " does not have " + std::to_string(x[1]) + " channels";
  }
  return "";
}

ConvParams conv_params(const ir::Node& node) {
  ConvParams p;
  if (!pair_attr(node.attrs, "stride", p.stride) || !pair_attr(node.attrs, "padding", p.padding) ||
      !pair_attr(node.attrs, "dilation", p.dilation))
    throw CompileError("node '" + node.name + "': convolution stride/padding/dilation are not 1 or 2 integers");
  p.groups = node.int_attr("groups", 1);
  return p;
}

}  // namespace kiln::ops
