// Common subexpressions: a node with the same op, attributes and inputs as
// an earlier one is computed once. torch.export records a model's repeated
// work as it was written: Hugging Face BERT turns its attention mask into an
// additive bias in every layer (12 identical elementwise kernels), and
// models recompute shape-derived tensors per block. Every ATen op Kiln
// compiles is a pure function of its inputs and attributes, so merging is
// exact.
#include <map>
#include <sstream>
#include <string>

#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

void write_attr(std::ostringstream& out, const ir::Attr& a) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
          out << "[";
          for (const auto& x : v) out << x << ",";
          out << "]";
        } else {
          out << v;
        }
      },
      a);
  out << "#" << a.index();
}

std::string key_of(const ir::Node& node, const std::vector<int>& inputs, const ir::Graph& src) {
  std::ostringstream out;
  out.precision(17);
  out << node.op << "(";
  for (int in : inputs) out << in << ",";
  out << "){";
  for (const auto& [name, a] : node.attrs) {
    out << name << "=";
    write_attr(out, a);
    out << ";";
  }
  out << "}->";
  for (int o : node.outputs) {
    const ir::Value& v = src.value(o);
    out << static_cast<int>(v.dtype) << ir::shape_to_string(v.shape);
  }
  return out.str();
}

}  // namespace

ir::Graph merge_common_subexpressions(const ir::Graph& graph) {
  GraphRewriter rw(graph);
  bool merged = false;
  // Small constants with equal bytes are one value (the scalars each layer
  // lifted on its own), so the nodes reading them can merge too.
  constexpr size_t kSmallConstantBytes = 4096;
  std::map<std::string, int> constant_ids;
  for (const ir::Value& v : graph.values()) {
    if (!v.is_constant || v.data.size() > kSmallConstantBytes) continue;
    std::string key = std::to_string(static_cast<int>(v.dtype)) + ir::shape_to_string(v.shape);
    key.append(v.data.begin(), v.data.end());
    auto [it, fresh] = constant_ids.emplace(key, v.id);
    if (!fresh) {
      rw.set_map(v.id, rw.map(it->second));
      merged = true;
    }
  }
  std::map<std::string, const ir::Node*> seen;
  for (const ir::Node& node : graph.nodes()) {
    if (folded_to_constants(graph, node)) continue;
    std::vector<int> inputs;
    for (int in : node.inputs) inputs.push_back(rw.map(in));
    if (node.outputs.empty() || node.op == "kiln.folded") {
      rw.copy_node(node, inputs);
      continue;
    }
    const std::string key = key_of(node, inputs, graph);
    if (auto it = seen.find(key); it != seen.end()) {
      for (size_t i = 0; i < node.outputs.size(); ++i) rw.set_map(node.outputs[i], rw.map(it->second->outputs[i]));
      merged = true;
      continue;
    }
    rw.copy_node(node, inputs);
    seen.emplace(key, &node);
  }
  if (!merged) return graph;
  return rw.finish();
}

}  // namespace kiln::passes
