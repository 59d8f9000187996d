#include "ops/softmax_ops.h"

#include <algorithm>
#include <cmath>

#include "ops/dim_arg.h"
#include "ops/op_registry.h"
#include "ops/softmax_kernel.h"

namespace kiln::ops {
namespace {

constexpr const char* kSoftmax = "aten._softmax.default";
constexpr const char* kLogSoftmax = "aten._log_softmax.default";

// The dim, normalized to [0, rank); a 0-d tensor is one element.
int64_t softmax_dim(const ir::Node& node, size_t rank) {
  int64_t d = 0;
  const std::string why = normalize_dim(node.int_attr("dim", -1), rank, node.op, &d);
  if (!why.empty()) throw CompileError(why);
  return d;
}

const ir::Node& node_at(PlanContext& ctx, int index) { return ctx.graph().nodes()[static_cast<size_t>(index)]; }

// The node reading `value` when it is the only one and has op `op`; -1 otherwise.
int sole(PlanContext& ctx, int value, const char* op) {
  const int c = ctx.sole_consumer(value);
  return c >= 0 && node_at(ctx, c).op == op ? c : -1;
}

// PyTorch's safe softmax around the _softmax node `n` (torch.export of
// scaled_dot_product_attention writes it out):
//   masked = logical_not(any(logical_not(eq(x, -inf)), dim, keepdim))
//   y = where(masked, full_like(sm, 0), sm)
// Returns the nodes to absorb (eq, not, any, not, full_like, where) when it
// matches exactly, else empty.
std::vector<int> safe_chain(PlanContext& ctx, const ir::Node& n, int64_t dim) {
  const ir::Graph& g = ctx.graph();
  const int x = n.inputs[0], sm = n.outputs[0];
  const size_t rank = g.value(x).shape.size();
  if (ctx.is_output(sm) || ctx.consumers(sm).size() != 2) return {};
  for (int eq : ctx.consumers(x)) {
    const ir::Node& e = node_at(ctx, eq);
    if (ctx.absorbed(eq) || e.op != "aten.eq.Scalar" || e.inputs.size() != 1) continue;
    const double other = e.float_attr("other", 0.0);
    if (!(std::isinf(other) && other < 0)) continue;
    const int not1 = sole(ctx, e.outputs[0], "aten.logical_not.default");
    if (not1 < 0) continue;
    const int any = sole(ctx, node_at(ctx, not1).outputs[0], "aten.any.dim");
    if (any < 0) continue;
    const ir::Node& a = node_at(ctx, any);
    int64_t ad = a.int_attr("dim", -1000);
    if (ad < 0) ad += static_cast<int64_t>(rank);
    if (ad != dim || a.int_attr("keepdim", 0) == 0) continue;
    const int not2 = sole(ctx, a.outputs[0], "aten.logical_not.default");
    if (not2 < 0) continue;
    const int where = sole(ctx, node_at(ctx, not2).outputs[0], "aten.where.self");
    if (where < 0) continue;
    const ir::Node& w = node_at(ctx, where);
    if (w.inputs.size() != 3 || w.inputs[0] != node_at(ctx, not2).outputs[0] || w.inputs[2] != sm) continue;
    const int fill = g.value(w.inputs[1]).producer;
    if (fill < 0 || node_at(ctx, fill).op != "aten.full_like.default" || node_at(ctx, fill).inputs.size() != 1 ||
        node_at(ctx, fill).inputs[0] != sm || node_at(ctx, fill).float_attr("fill_value", 1.0) != 0.0 ||
        ctx.sole_consumer(w.inputs[1]) != where)
      continue;
    const std::vector<int>& sc = ctx.consumers(sm);
    if (!((sc[0] == fill && sc[1] == where) || (sc[0] == where && sc[1] == fill))) continue;
    const ir::Value& y = g.value(w.outputs[0]);
    if (y.shape != g.value(sm).shape || y.dtype != g.value(sm).dtype) continue;
    return {eq, not1, any, not2, fill, where};
  }
  return {};
}

void plan_softmax_step(PlanContext& ctx, int node_index) {
  const ir::Node n = node_at(ctx, node_index);
  SoftmaxPlan p = plan_softmax(ctx.graph(), n);
  std::string label = p.log ? "log_softmax" : "softmax";
  if (!p.log) {
    std::vector<int> chain = safe_chain(ctx, n, softmax_dim(n, ctx.graph().value(p.input).shape.size()));
    if (!chain.empty()) {
      for (int c : chain) ctx.absorb(c);
      p.out = node_at(ctx, chain.back()).outputs[0];
      p.safe = true;
      label = "safe_softmax";
    }
  }
  ctx.emit(PlannedOp(label, std::move(p)));
}

}  // namespace

std::string check_softmax(const OpQuery& q) {
  if (q.inputs.size() != 1 || q.outputs.size() != 1) return q.op + " needs one tensor input and one output";
  if (q.outputs[0].shape != q.inputs[0].shape) return q.op + ": the output does not have the input's shape";
  ir::Node node;
  node.op = q.op;
  node.name = q.op;
  node.attrs = q.attrs;
  try {
    softmax_dim(node, q.inputs[0].shape.size());
  } catch (const CompileError& e) {
    return e.what();
  }
  if (ir::numel_of(q.inputs[0].shape) == 0) return q.op + " of an empty tensor";
  return "";
}

SoftmaxPlan plan_softmax(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value& x = graph.value(node.inputs.at(0));
  const ir::Value& y = graph.value(node.outputs.at(0));
  if (y.shape != x.shape)
    throw CompileError("node '" + node.name + "': output " + ir::shape_to_string(y.shape) +
                       " does not match the input " + ir::shape_to_string(x.shape));
  if (x.numel() == 0) throw CompileError("node '" + node.name + "': softmax of an empty tensor");
  int64_t dim = 0;
  try {
    dim = softmax_dim(node, x.shape.size());
  } catch (const CompileError& e) {
    throw CompileError("node '" + node.name + "': " + e.what());
  }
  SoftmaxPlan p;
  p.input = x.id;
  p.out = y.id;
  p.log = node.op == kLogSoftmax;
  if (!x.shape.empty()) {
    p.length = x.shape[static_cast<size_t>(dim)];
    for (int64_t d = 0; d < static_cast<int64_t>(x.shape.size()); ++d) {
      if (d < dim) p.outer *= x.shape[static_cast<size_t>(d)];
      if (d > dim) p.inner *= x.shape[static_cast<size_t>(d)];
    }
  }
  return p;
}

void SoftmaxPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name(log ? "kiln_log_softmax" : "kiln_softmax");
  SoftmaxKernel gen = generate_softmax_kernel(ctx.graph(), *this, k.function);
  ctx.add_source(gen.source);
  k.grid[0] = gen.launch.grid;
  k.block[0] = gen.launch.block_x;
  k.block[1] = gen.launch.block_y;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input), LowerContext::int_arg(ctx.graph().value(out).numel())};
}

KILN_REGISTER_OPS(softmax) {
  for (const char* name : {kSoftmax, kLogSoftmax}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check_softmax;
    def.plan = plan_softmax_step;
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
