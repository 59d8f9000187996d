// After fusion: depthwise conv steps (groups == c == k, no residual) become
// generated NHWC kernels (ops/depthwise_kernel.h) that take over the
// elementwise kernel that is the conv value's only reader as their epilogue.
// Off with the depthwise_kernels compile option (they then stay on cuDNN).
// mobilenet_v3 b8 on the H200: 0.86 -> 0.40 ms with graph replay.
#include <algorithm>
#include <cstring>

#include "ops/step_plan.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// One value, one per channel, or one per element of a conv output `out`
// (the operands codegen/depthwise_codegen reads in its epilogue).
bool depthwise_operand_ok(const std::vector<int64_t>& operand, const std::vector<int64_t>& out) {
  if (ir::numel_of(operand) == 1 || operand == out) return true;
  if (operand.empty() || out.empty() || operand.size() > out.size()) return false;
  return operand.back() == out.back() && ir::numel_of(operand) == out.back();
}

bool is_depthwise(const ir::Graph& g, const ops::ConvPlan& c) {
  const ir::Value& x = g.value(c.x);
  const ir::Value& w = g.value(c.w);
  const ir::Value& y = g.value(c.out);
  const bool float_type = y.dtype == engine::DType::kFloat32 || y.dtype == engine::DType::kFloat16 ||
                          y.dtype == engine::DType::kBFloat16;
  return c.z < 0 && x.shape.size() == 4 && w.shape.size() == 4 && y.shape.size() == 4 && w.is_constant &&
         w.shape[3] == 1 && w.shape[0] == x.shape[3] && c.groups == x.shape[3] && y.shape[3] == x.shape[3] &&
         float_type && x.dtype == y.dtype && w.dtype == y.dtype && (c.bias < 0 || g.value(c.bias).dtype == y.dtype);
}

// The OHWI weight [k, r, s, 1] as [r, s, k]: neighbouring channels adjacent.
int rsc_weight(ir::Graph& g, int id) {
  const ir::Value& w = g.value(id);
  const int64_t k = w.shape[0], rs = w.shape[1] * w.shape[2];
  const size_t elem = engine::dtype_size(w.dtype);
  std::vector<uint8_t> data(w.data.size());
  for (int64_t o = 0; o < k; ++o)
    for (int64_t j = 0; j < rs; ++j)
      std::memcpy(&data[static_cast<size_t>(j * k + o) * elem], &w.data[static_cast<size_t>(o * rs + j) * elem], elem);
  return g.add_constant(w.name + "_rsc", w.dtype, {w.shape[1], w.shape[2], k}, std::move(data));
}

}  // namespace

void plan_depthwise_kernels(ir::Graph& graph, ExecPlan& plan) {
  std::vector<bool> is_output(graph.values().size(), false);
  for (int id : graph.outputs()) is_output[static_cast<size_t>(plan.storage_of(id))] = true;
  std::vector<bool> viewed(graph.values().size(), false);  // storage some view aliases
  for (const auto& [view, root] : plan.alias_of) viewed[static_cast<size_t>(root)] = true;
  std::vector<bool> remove(plan.ops.size(), false);
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    ops::PlannedOp& conv = plan.ops[i];
    const ops::ConvPlan* cp = conv.as<ops::ConvPlan>();
    if (cp == nullptr || !is_depthwise(graph, *cp)) continue;
    ops::DepthwisePlan d;
    std::string label = "dw" + conv.label;
    d.conv = *cp;
    d.weight = rsc_weight(graph, cp->w);
    d.out = d.conv.out;
    // The chain after it becomes the epilogue when it is the conv value's only
    // reader and iterates over the conv's output elements.
    const int v = d.conv.out;
    std::vector<size_t> readers;
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      if (j == i || remove[j]) continue;
      for (int r : plan.ops[j].reads())
        if (plan.storage_of(r) == v) {
          readers.push_back(j);
          break;
        }
    }
    size_t place = i;
    if (readers.size() == 1 && readers[0] > i && !is_output[static_cast<size_t>(v)] && !viewed[static_cast<size_t>(v)]) {
      const ops::PlannedOp& next = plan.ops[readers[0]];
      const ops::PointwisePlan* pp = next.as<ops::PointwisePlan>();
      static const ops::PointwisePlan kNone;
      const ops::PointwisePlan& p = pp ? *pp : kNone;
      const std::vector<int64_t>& shape = graph.value(v).shape;
      bool ok = pp != nullptr && !p.nodes.empty() && p.iter_shape.empty() &&
                p.input_map.coef.empty() && p.output_map.coef.empty() && p.strided.empty() &&
                graph.value(p.out).shape == shape &&
                std::count(p.inputs.begin(), p.inputs.end(), v) == 1;
      for (int in : p.inputs) ok = ok && (in == v || depthwise_operand_ok(graph.value(in).shape, shape));
      if (ok) {
        d.epilogue = p;
        d.epilogue.inputs.erase(std::find(d.epilogue.inputs.begin(), d.epilogue.inputs.end(), v));
        d.out = p.out;
        label += "+" + next.label;
        place = readers[0];  // every epilogue operand exists there
      }
    }
    ops::PlannedOp op(label, std::move(d));
    if (place != i) {
      plan.ops[place] = std::move(op);
      remove[i] = true;
    } else {
      conv = std::move(op);
    }
  }
  erase_steps(plan, remove);
}

}  // namespace kiln::passes
