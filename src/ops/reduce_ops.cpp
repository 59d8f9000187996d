#include "ops/reduce_ops.h"

#include <algorithm>

#include "ops/dim_arg.h"
#include "ops/norm_ops.h"
#include "ops/op_registry.h"
#include "ops/reduce_kernel.h"

namespace kiln::ops {

bool is_reduce_op(const std::string& op) {
  return op == "aten.sum.dim_IntList" || op == "aten.sum.default" || op == "aten.mean.dim" ||
         op == "aten.mean.default" || op == "aten.amax.default" || op == "aten.any.dim";
}

std::string check_reduce(const OpQuery& q) {
  if (q.inputs.size() != 1 || q.outputs.size() != 1) return q.op + " needs one tensor input and one output";
  if (q.inputs[0].shape.empty()) return q.op + " of a 0-d tensor is not supported";
  const bool any = q.op == "aten.any.dim";
  if (any && (q.inputs[0].dtype != engine::DType::kBool || q.outputs[0].dtype != engine::DType::kBool))
    return q.op + " is taken over bool tensors only";
  if (any) {
    // any over an empty dim is false; the max form would give true.
    auto it = q.attrs.find("dim");
    const int64_t* d = it == q.attrs.end() ? nullptr : std::get_if<int64_t>(&it->second);
    if (d == nullptr) return q.op + " needs an integer dim";
    int64_t dim = 0;
    const std::string why = normalize_dim(*d, q.inputs[0].shape.size(), q.op, &dim, false);
    if (!why.empty()) return why;
    if (q.inputs[0].shape[static_cast<size_t>(dim)] == 0) return q.op + " over an empty dim";
  }
  return "";
}

ReducePlan plan_reduce(const ir::Graph& graph, const ir::Node& node) {
  ReducePlan plan;
  plan.input = node.inputs.at(0);
  plan.out = node.outputs.at(0);
  // any over bools (0/1) is their max.
  plan.kind = node.op.rfind("aten.mean", 0) == 0                                         ? ReducePlan::Kind::kMean
              : node.op.rfind("aten.amax", 0) == 0 || node.op.rfind("aten.any", 0) == 0 ? ReducePlan::Kind::kMax
                                                                                         : ReducePlan::Kind::kSum;
  const ir::Value& in = graph.value(plan.input);
  int64_t rank = static_cast<int64_t>(in.shape.size());
  std::vector<int64_t> dims = node.has_attr("dim") ? node.ints_attr("dim") : std::vector<int64_t>{};
  if (dims.empty())  // no dims: reduce everything
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  for (int64_t& d : dims) {
    const std::string why = normalize_dim(d, in.shape.size(), "node '" + node.name + "':", &d, false);
    if (!why.empty()) throw CompileError(why);
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  plan.dims = dims;
  int64_t reduced = 1;
  for (int64_t d : dims) reduced *= in.shape[static_cast<size_t>(d)];
  if (reduced == 0 && plan.kind == ReducePlan::Kind::kMax)
    throw CompileError("node '" + node.name + "': " + node.op + " over an empty dimension");
  if (graph.value(plan.out).numel() * reduced != in.numel())
    throw CompileError("node '" + node.name + "': output size does not match the reduction");
  return plan;
}

void ReducePlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_reduce");
  ReduceKernel gen = generate_reduce_kernel(ctx.graph(), *this, k.function);
  ctx.add_source(gen.source);
  for (int d = 0; d < 3; ++d) {
    k.grid[d] = gen.grid[d];
    k.block[d] = gen.block[d];
  }
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(input), LowerContext::int_arg(ctx.graph().value(out).numel())};
}

KILN_REGISTER_OPS(reduce) {
  for (const char* name :
       {"aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default", "aten.amax.default",
        "aten.any.dim"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.bool_inputs = std::string(name) == "aten.any.dim";
    def.check = check_reduce;
    def.plan = [](PlanContext& ctx, int node) {
      const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
      if (n.op == "aten.mean.dim" && plan_rms_norm(ctx, node)) return;  // the mean of an RMSNorm
      std::string label = n.op.substr(5, n.op.find('.', 5) - 5);  // "aten.mean.dim" -> "mean"
      ctx.emit(PlannedOp(label, plan_reduce(ctx.graph(), n)));
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
