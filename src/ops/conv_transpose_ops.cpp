#include "ops/conv_transpose_ops.h"

#include <algorithm>

#include "ops/conv_ops.h"
#include "ops/op_registry.h"

namespace kiln::ops {
namespace {

// Plans a kiln.conv_transpose2d_nhwc node: one kernel, absorbing a ReLU that
// is the result's only reader.
void plan_conv_transpose(PlanContext& ctx, int node_index) {
  ir::Graph& g = ctx.graph();
  const ir::Node& node = g.nodes()[static_cast<size_t>(node_index)];
  const ir::Value& x = g.value(node.inputs.at(0));
  const ir::Value& w = g.value(node.inputs.at(1));
  const ir::Value& y = g.value(node.outputs.at(0));
  if (x.shape.size() != 4 || w.shape.size() != 4 || y.shape.size() != 4)
    throw CompileError("node '" + node.name + "': transposed convolution needs a 4-D NHWC input, weight and output");
  const ConvParams p = conv_params(node);
  ConvTransposePlan c;
  c.x = x.id;
  c.w = w.id;
  c.bias = node.inputs.size() > 2 ? node.inputs[2] : -1;
  c.stride_h = p.stride[0];
  c.stride_w = p.stride[1];
  c.pad_h = p.padding[0];
  c.pad_w = p.padding[1];
  c.dilation_h = p.dilation[0];
  c.dilation_w = p.dilation[1];
  c.groups = p.groups;
  for (int i = 0; i < 2; ++i) {
    const size_t d = 1 + static_cast<size_t>(i);
    const int64_t expect = conv_transpose_output_size(x.shape[d], w.shape[static_cast<size_t>(i)], p.padding[i],
                                                      p.stride[i], p.dilation[i], p.output_padding[i]);
    if (y.shape[d] != expect)
      throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) +
                         " does not match the transposed convolution of " + ir::shape_to_string(x.shape));
  }
  if (p.groups < 1 || x.shape[3] % p.groups != 0 || w.shape[2] != x.shape[3] || w.shape[3] * p.groups != y.shape[3] ||
      y.shape[0] != x.shape[0] || (c.bias >= 0 && g.value(c.bias).numel() != y.shape[3]))
    throw CompileError("node '" + node.name + "': input " + ir::shape_to_string(x.shape) + ", weight " +
                       ir::shape_to_string(w.shape) + " and output " + ir::shape_to_string(y.shape) +
                       " do not match groups=" + std::to_string(p.groups));
  std::string label = "conv_transpose";
  c.out = y.id;
  const int index = ctx.sole_consumer(c.out);
  if (index >= 0) {
    const ir::Node& next = g.nodes()[static_cast<size_t>(index)];
    if (next.op == "aten.relu.default" && g.value(next.outputs[0]).dtype == y.dtype) {
      c.relu = true;
      c.out = next.outputs[0];
      ctx.absorb(index);
      label += "+relu";
      ctx.emit_at(index, PlannedOp(label, std::move(c)));
      return;
    }
  }
  ctx.emit(PlannedOp(label, std::move(c)));
}

}  // namespace

std::vector<int> ConvTransposePlan::reads() const {
  std::vector<int> r = {x, w};
  if (bias >= 0) r.push_back(bias);
  return r;
}

void ConvTransposePlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_convt");
  ConvTransposeKernel gen = generate_conv_transpose_kernel(ctx.graph(), *this, k.function);
  ctx.add_source(gen.source);
  k.grid[0] = gen.grid;
  k.block[0] = gen.block;
  for (int v : gen.tensor_args) k.args.push_back(ctx.tensor_arg(v));
  k.args.push_back(LowerContext::int_arg(gen.n));
}

// aten.convolution.default (transposed=True) is registered and checked in
// conv_ops.cpp; the channels-last pass makes this node from it.
KILN_REGISTER_OPS(conv_transpose) {
  OpDef def;
  def.name = kConvTransposeNhwc;
  def.role = OpRole::kStep;
  def.plan = plan_conv_transpose;
  register_op(std::move(def));
}

}  // namespace kiln::ops
