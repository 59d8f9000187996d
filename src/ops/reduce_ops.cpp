#include "ops/reduce_ops.h"

#include <algorithm>

namespace kiln::ops {

bool is_reduce_op(const std::string& op) {
  return op == "aten.sum.dim_IntList" || op == "aten.sum.default" || op == "aten.mean.dim" ||
         op == "aten.mean.default" || op == "aten.amax.default";
}

std::string check_reduce(const compiler::OpQuery& q) {
  if (q.inputs.size() != 1 || q.outputs.size() != 1) return q.op + " needs one tensor input and one output";
  if (q.inputs[0].shape.empty()) return q.op + " of a 0-d tensor is not supported";
  return "";
}

passes::ReducePlan plan_reduce(const ir::Graph& graph, const ir::Node& node) {
  passes::ReducePlan plan;
  plan.input = node.inputs.at(0);
  plan.out = node.outputs.at(0);
  plan.kind = node.op.rfind("aten.mean", 0) == 0   ? passes::ReducePlan::Kind::kMean
              : node.op.rfind("aten.amax", 0) == 0 ? passes::ReducePlan::Kind::kMax
                                                   : passes::ReducePlan::Kind::kSum;
  const ir::Value& in = graph.value(plan.input);
  int64_t rank = static_cast<int64_t>(in.shape.size());
  std::vector<int64_t> dims = node.has_attr("dim") ? node.ints_attr("dim") : std::vector<int64_t>{};
  if (dims.empty())  // no dims: reduce everything
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  for (int64_t& d : dims) {
    if (d < -rank || d >= rank)
      throw CompileError("node '" + node.name + "': dimension " + std::to_string(d) + " out of range");
    if (d < 0) d += rank;
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  plan.dims = dims;
  int64_t reduced = 1;
  for (int64_t d : dims) reduced *= in.shape[static_cast<size_t>(d)];
  if (reduced == 0 && plan.kind == passes::ReducePlan::Kind::kMax)
    throw CompileError("node '" + node.name + "': amax over an empty dimension");
  if (graph.value(plan.out).numel() * reduced != in.numel())
    throw CompileError("node '" + node.name + "': output size does not match the reduction");
  return plan;
}

}  // namespace kiln::ops
