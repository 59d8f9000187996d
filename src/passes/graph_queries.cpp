#include "passes/graph_queries.h"

#include "ops/attention_ops.h"
#include "ops/op_registry.h"
#include "ops/rotary_ops.h"
#include "ops/view_ops.h"

namespace kiln::passes {

bool is_layout_copy(const ir::Graph& graph, const ir::Node& node) {
  const std::string& op = node.op;
  return ops::is_constant_permute_op(op) || op == "aten.expand_copy.default" || op == "aten.slice_copy.Tensor" ||
         op == "aten.select_copy.int" || ops::is_identity_copy(graph, node);
}

int sole_reader(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v) {
  const auto& c = consumers[static_cast<size_t>(v)];
  if (c.size() != 1) return -1;
  for (int o : graph.outputs())
    if (o == v) return -1;
  return c[0];
}

namespace {

bool only_attention_reads_at(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v,
                             int depth) {
  if (depth > 24) return false;
  for (int o : graph.outputs())
    if (o == v) return false;
  const auto& readers = consumers[static_cast<size_t>(v)];
  if (readers.empty()) return false;
  for (int r : readers) {
    const ir::Node& n = graph.nodes()[static_cast<size_t>(r)];
    if (ops::is_attention_op(n.op)) continue;
    if (!(ops::is_view_op(n.op) || is_layout_copy(graph, n)) || n.outputs.size() != 1 || n.inputs.empty() ||
        n.inputs[0] != v)
      return false;
    if (!only_attention_reads_at(graph, consumers, n.outputs[0], depth + 1)) return false;
  }
  return true;
}

}  // namespace

bool only_attention_reads(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v) {
  return only_attention_reads_at(graph, consumers, v, 0);
}

namespace {

// Several readers, every one an elementwise op (each kernel reads `v`
// through strides on its own), and `v` is no graph output.
bool all_elementwise_readers(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v) {
  const auto& readers = consumers[static_cast<size_t>(v)];
  if (readers.size() < 2) return false;
  for (int o : graph.outputs())
    if (o == v) return false;
  return ops::all_elementwise(graph, readers);
}

bool only_strided_reads_at(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v, int depth) {
  if (depth > 24) return false;
  const int r = sole_reader(graph, consumers, v);
  if (r < 0 && all_elementwise_readers(graph, consumers, v)) return true;  // e.g. silu(g) = g * sigmoid(g)
  if (r < 0) return only_attention_reads_at(graph, consumers, v, depth);
  const ir::Node& n = graph.nodes()[static_cast<size_t>(r)];
  if (ops::is_attention_op(n.op)) return true;
  if (n.op == ops::kKilnRotaryOp) return n.inputs.at(0) == v;
  if (n.op == "aten.index_put.default") return n.inputs.size() == 3 && n.inputs[2] == v;
  const ops::OpDef* def = ops::find_op(n.op);
  if (def != nullptr && def->role == ops::OpRole::kElementwise) return true;
  const bool chain = ops::is_view_op(n.op) || ops::is_constant_permute_op(n.op) || n.op == "aten.slice_copy.Tensor" ||
                     n.op == "aten.select_copy.int";
  if (!chain || n.outputs.size() != 1 || n.inputs.empty() || n.inputs[0] != v) return false;
  return only_strided_reads_at(graph, consumers, n.outputs[0], depth + 1);
}

}  // namespace

bool only_strided_reads(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v) {
  return only_strided_reads_at(graph, consumers, v, 0);
}

}  // namespace kiln::passes
