#include "compiler/input_bounds.h"

#include <algorithm>
#include <map>

#include "codegen/cuda_dtype.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"

namespace kiln::compiler {
namespace {

// The value `id` carries unchanged from, or -1: its producer's one tensor input when the
// producer only reshapes, reorders or widens the same values.
int passes_values_from(const ir::Graph& graph, int id) {
  const int producer = graph.value(id).producer;
  if (producer < 0) return -1;
  const ir::Node& n = graph.nodes()[static_cast<size_t>(producer)];
  if (n.inputs.size() != 1 || n.outputs.size() != 1) return -1;
  const engine::DType from = graph.value(n.inputs[0]).dtype, to = graph.value(id).dtype;
  if (!codegen::is_integer(from) || !codegen::is_integer(to)) return -1;
  const bool widening = from == to || to == engine::DType::kInt64;
  const bool same_values = ops::is_view_op(n.op) || ops::is_constant_permute_op(n.op) ||
                           ops::is_identity_copy(graph, n) || n.op == "aten.expand_copy.default" ||
                           n.op == "aten._to_copy.default" || n.op == "dim_order_ops._to_dim_order_copy.default";
  return same_values && widening ? n.inputs[0] : -1;
}

}  // namespace

std::vector<engine::InputBound> input_index_bounds(const ir::Graph& graph) {
  std::map<int, size_t> input_number;  // value id -> engine input
  for (size_t i = 0; i < graph.inputs().size(); ++i) input_number[graph.inputs()[i]] = i;
  std::map<size_t, engine::InputBound> bounds;
  for (const ir::Node& node : graph.nodes()) {
    const ops::OpDef* def = ops::find_op(node.op);
    if (def == nullptr || !def->index_ranges) continue;
    for (const ops::IndexRange& r : def->index_ranges(graph, node)) {
      if (r.input < 0 || static_cast<size_t>(r.input) >= node.inputs.size()) continue;
      int id = node.inputs[static_cast<size_t>(r.input)];
      for (int from = passes_values_from(graph, id); from >= 0; from = passes_values_from(graph, id)) id = from;
      auto in = input_number.find(id);
      if (in == input_number.end() || !codegen::is_integer(graph.value(id).dtype)) continue;
      auto [it, fresh] = bounds.try_emplace(in->second);
      if (fresh)
        it->second = {static_cast<uint32_t>(in->second), r.lo, r.hi, r.what};
      else  // several uses: the values must suit every one
        intersect_bound(it->second, r.lo, r.hi, r.what);
    }
  }
  std::vector<engine::InputBound> out;
  for (auto& [input, b] : bounds)
    if (b.lo < b.hi) out.push_back(std::move(b));
  return out;
}

void intersect_bound(engine::InputBound& b, int64_t lo, int64_t hi, const std::string& what) {
  if (hi - lo < b.hi - b.lo) b.what = what;
  b.lo = std::max(b.lo, lo);
  b.hi = std::min(b.hi, hi);
}

}  // namespace kiln::compiler
