#include "passes/fuse_conv.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/conv_ops.h"

namespace kiln::passes {
namespace {

// KILN_CONV_GEMM: unset or "1": 1x1 convs as GEMMs, strided ones through a
// gather kernel; "unstrided": stride-1 ones only; "0": none (all on cuDNN).
bool gemm_for_1x1() {
  const char* env = std::getenv("KILN_CONV_GEMM");
  return !(env && std::strcmp(env, "0") == 0);
}
bool gemm_for_strided_1x1() {
  const char* env = std::getenv("KILN_CONV_GEMM");
  return !(env && std::strcmp(env, "unstrided") == 0);
}

// The only consumer of `v` when v has exactly one and is not a graph output.
const ir::Node* sole_consumer(const ir::Graph& g, int v, const std::vector<std::vector<int>>& consumers,
                              const std::vector<bool>& is_output, const std::vector<bool>& absorbed, int* index) {
  const auto& users = consumers[static_cast<size_t>(v)];
  if (users.size() != 1 || is_output[static_cast<size_t>(v)] || absorbed[static_cast<size_t>(users[0])])
    return nullptr;
  *index = users[0];
  return &g.nodes()[static_cast<size_t>(users[0])];
}

bool unit_alpha(const ir::Node& n) { return n.float_attr("alpha", 1.0) == 1.0; }

// A constant that adds one value per output channel of an [n,p,q,k] tensor.
bool is_channel_bias(const ir::Value& v, int64_t k) {
  if (!v.is_constant || v.numel() != k || v.shape.empty() || v.shape.back() != k) return false;
  return v.shape.size() <= 4;
}

}  // namespace

ConvFusion plan_conv(ir::Graph& g, int node_index, const std::vector<std::vector<int>>& consumers,
                     const std::vector<bool>& is_output, const std::vector<bool>& absorbed) {
  const ir::Node& node = g.nodes()[static_cast<size_t>(node_index)];
  const ir::Value& x = g.value(node.inputs.at(0));
  const ir::Value& w = g.value(node.inputs.at(1));
  if (x.shape.size() != 4 || w.shape.size() != 4)
    throw CompileError("node '" + node.name + "': convolution needs a 4-D input and weight");
  ops::ConvParams params = ops::conv_params(node);
  ConvFusion f;
  f.emit_at = node_index;
  ConvPlan& c = f.op.conv;
  c.x = x.id;
  c.w = w.id;
  c.bias = node.inputs.size() > 2 ? node.inputs[2] : -1;
  c.pad_h = params.padding[0];
  c.pad_w = params.padding[1];
  c.stride_h = params.stride[0];
  c.stride_w = params.stride[1];
  c.dilation_h = params.dilation[0];
  c.dilation_w = params.dilation[1];
  c.groups = params.groups;
  int out = node.outputs.at(0);
  const ir::Value& y = g.value(out);
  const int64_t k = w.shape[0];
  if (y.shape.size() != 4 || y.shape[3] != k || y.shape[0] != x.shape[0])
    throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) + " does not match weight " +
                       ir::shape_to_string(w.shape));
  for (int i = 0; i < 2; ++i) {
    int64_t expect = ops::conv_output_size(x.shape[1 + static_cast<size_t>(i)], w.shape[1 + static_cast<size_t>(i)],
                                           params.padding[i], params.stride[i], params.dilation[i]);
    if (y.shape[1 + static_cast<size_t>(i)] != expect)
      throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) +
                         " does not match the convolution of " + ir::shape_to_string(x.shape));
  }
  if (x.shape[3] != w.shape[3] * params.groups)
    throw CompileError("node '" + node.name + "': input channels do not match weight and groups");
  f.op.label = "conv";
  // add_constant/add_node below may move the graph's values: keep copies.
  const std::vector<int64_t> x_shape = x.shape, w_shape = w.shape, y_shape = y.shape;
  const std::string x_name = x.name;
  const engine::DType x_dtype = x.dtype, y_dtype = y.dtype;

  // Absorb: [+ bias] [+ residual] [relu], each the previous value's only use.
  int index = -1;
  const ir::Node* next = sole_consumer(g, out, consumers, is_output, absorbed, &index);
  auto other_operand = [&](const ir::Node& add, int v) { return add.inputs[0] == v ? add.inputs[1] : add.inputs[0]; };
  if (next && c.bias < 0 && next->op == "aten.add.Tensor" && unit_alpha(*next) && next->inputs.size() == 2 &&
      next->inputs[0] != next->inputs[1]) {
    const ir::Value& b = g.value(other_operand(*next, out));
    if (is_channel_bias(b, k) && b.dtype == y_dtype && g.value(next->outputs[0]).shape == y_shape) {
      c.bias = b.shape.size() == 1 ? b.id : g.add_constant(b.name + "_k", b.dtype, {k}, b.data);
      out = next->outputs[0];
      f.absorbed.push_back(index);
      f.emit_at = index;
      f.op.label += "+bias";
      next = sole_consumer(g, out, consumers, is_output, absorbed, &index);
    }
  }
  if (next && next->op == "aten.add.Tensor" && unit_alpha(*next) && next->inputs.size() == 2 &&
      next->inputs[0] != next->inputs[1]) {
    const ir::Value& z = g.value(other_operand(*next, out));
    if (z.shape == y_shape && z.dtype == y_dtype && g.value(next->outputs[0]).shape == y_shape &&
        g.value(next->outputs[0]).dtype == y_dtype) {
      c.z = z.id;
      out = next->outputs[0];
      f.absorbed.push_back(index);
      f.emit_at = index;  // z exists once the add could run
      f.op.label += "+add";
      next = sole_consumer(g, out, consumers, is_output, absorbed, &index);
    }
  }
  if (next && next->op == "aten.relu.default" && g.value(next->outputs[0]).dtype == y_dtype) {
    c.relu = true;
    out = next->outputs[0];
    f.absorbed.push_back(index);
    f.emit_at = std::max(f.emit_at, index);
    f.op.label += "+relu";
  }
  c.out = out;

  const bool unstrided = c.stride_h == 1 && c.stride_w == 1;
  const bool one_by_one = w_shape[1] == 1 && w_shape[2] == 1 && c.pad_h == 0 && c.pad_w == 0 && c.groups == 1;
  if (one_by_one && gemm_for_1x1() && (unstrided || gemm_for_strided_1x1())) {
    int a = c.x;
    if (!unstrided) {
      // xs[n, i, j, :] = x[n, i*stride_h, j*stride_w, :]: a layout kernel,
      // then the same GEMM over the [n*p*q, c] rows.
      const std::vector<int64_t> sub = {x_shape[0], y_shape[1], y_shape[2], x_shape[3]};
      const std::string name = x_name + "_stride" + std::to_string(c.stride_h) + "x" + std::to_string(c.stride_w);
      int copy = g.add_node("kiln.copy", name, {c.x}, {}, {{x_dtype, sub}});
      a = g.nodes()[static_cast<size_t>(copy)].outputs[0];
      PlannedOp gather;
      gather.kind = PlannedOp::Kind::kPointwise;
      gather.label = "strided_gather";
      gather.pointwise.inputs = {c.x};
      gather.pointwise.out = a;
      const int64_t row = x_shape[2] * x_shape[3];  // elements per input row (w * c)
      gather.pointwise.input_map.coef = {x_shape[1] * row, c.stride_h * row, c.stride_w * x_shape[3], 1};
      f.before.push_back(std::move(gather));
    }
    // [n*p*q, c] x w[k, c]^T: the OHWI weight of a 1x1 conv is nn.Linear's layout.
    PlannedOp gemm;
    gemm.kind = PlannedOp::Kind::kGemm;
    gemm.label = f.op.label + (unstrided ? "(1x1 gemm)" : "(strided 1x1 gemm)");
    GemmPlan& gp = gemm.gemm;
    gp.a = a;
    gp.b = c.w;
    gp.b_transposed = true;
    gp.m = y_shape[0] * y_shape[1] * y_shape[2];
    gp.k = x_shape[3];
    gp.n = k;
    gp.bias = c.bias;
    if (c.z >= 0) {
      gp.c = c.z;
      gp.beta = 1.0f;
    }
    gp.epilogue = c.bias >= 0 ? (c.relu ? engine::GemmEpilogue::kReluBias : engine::GemmEpilogue::kBias)
                              : (c.relu ? engine::GemmEpilogue::kRelu : engine::GemmEpilogue::kNone);
    gp.out = c.out;
    f.op = gemm;
    return f;
  }
  f.op.kind = PlannedOp::Kind::kConv;
  return f;
}

}  // namespace kiln::passes
