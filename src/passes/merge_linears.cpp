// Sibling linears as one GEMM. Hugging Face BERT and Llama project the same
// hidden states several times (query, key, value; an MLP's gate and up),
// each a GEMM that at batch 1 is too small to fill the GPU (a decode step's
// GEMVs are launch-bound). When linears read the same input with constant
// weights of the same width and every use of their results can read a slice
// through strides (graph_queries.h only_strided_reads: attention operands,
// rotary, cache updates, fused elementwise kernels), they become one linear
// over the weights stacked by rows (and the biases concatenated); each old
// result is a slice of the new one's last dim, read in place, so no copy is
// added.
#include <map>
#include <string>

#include "passes/graph_queries.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr const char* kLinear = "aten.linear.default";

struct Group {
  std::vector<int> linears;  // node indices, in graph order
};

// The constant weight [n, k] (and constant bias [n], if any) of a linear.
bool constant_operands(const ir::Graph& graph, const ir::Node& n) {
  if (n.op != kLinear || n.outputs.size() != 1 || n.inputs.size() < 2 || n.inputs.size() > 3) return false;
  const ir::Value& w = graph.value(n.inputs[1]);
  if (!w.is_constant || w.shape.size() != 2) return false;
  if (n.inputs.size() == 3) {
    const ir::Value& b = graph.value(n.inputs[2]);
    if (!b.is_constant || b.shape.size() != 1 || b.dtype != w.dtype) return false;
  }
  return true;
}

std::string key_of(const ir::Graph& graph, const ir::Node& n) {
  const ir::Value& w = graph.value(n.inputs[1]);
  return std::to_string(n.inputs[0]) + "/" + std::to_string(static_cast<int>(w.dtype)) + "/" +
         std::to_string(w.shape[1]) + "/" + std::to_string(n.inputs.size());
}

}  // namespace

ir::Graph merge_sibling_linears(const ir::Graph& graph) {
  const auto consumers = consumers_of(graph);
  std::map<std::string, Group> groups;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const ir::Node& n = graph.nodes()[i];
    if (!constant_operands(graph, n) || !only_strided_reads(graph, consumers, n.outputs[0])) continue;
    groups[key_of(graph, n)].linears.push_back(static_cast<int>(i));
  }
  std::map<int, const Group*> first_of;  // the group's first linear -> group
  std::map<int, bool> merged;            // every linear of a merged group
  for (const auto& [key, g] : groups) {
    if (g.linears.size() < 2) continue;
    first_of[g.linears.front()] = &g;
    for (int l : g.linears) merged[l] = true;
  }
  if (first_of.empty()) return graph;

  GraphRewriter rw(graph);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const ir::Node& node = graph.nodes()[i];
    if (folded_to_constants(graph, node)) continue;
    std::vector<int> inputs;
    for (int in : node.inputs) inputs.push_back(rw.map(in));
    auto f = first_of.find(static_cast<int>(i));
    if (f == first_of.end()) {
      if (!merged.count(static_cast<int>(i))) rw.copy_node(node, inputs);
      continue;  // the other linears of a group are emitted with its first
    }
    // Stack the weights by rows and concatenate the biases.
    const Group& g = *f->second;
    const ir::Value& w0 = graph.value(node.inputs[1]);
    std::vector<uint8_t> w, b;
    int64_t n_total = 0;
    std::string name;
    for (int l : g.linears) {
      const ir::Node& lin = graph.nodes()[static_cast<size_t>(l)];
      const ir::Value& wl = graph.value(lin.inputs[1]);
      w.insert(w.end(), wl.data.begin(), wl.data.end());
      if (lin.inputs.size() == 3) {
        const ir::Value& bl = graph.value(lin.inputs[2]);
        b.insert(b.end(), bl.data.begin(), bl.data.end());
      }
      n_total += wl.shape[0];
      name += (name.empty() ? "" : "+") + lin.name;
    }
    std::vector<int> merged_inputs = {inputs[0], rw.add_constant(name + "_weight", w0.dtype, {n_total, w0.shape[1]}, w)};
    if (node.inputs.size() == 3) merged_inputs.push_back(rw.add_constant(name + "_bias", w0.dtype, {n_total}, b));
    const ir::Value& out0 = graph.value(node.outputs[0]);
    std::vector<int64_t> shape = out0.shape;
    shape.back() = n_total;
    const int all = rw.emit(kLinear, name, merged_inputs, node.attrs, out0.dtype, shape);
    int64_t start = 0;
    const int64_t last = static_cast<int64_t>(shape.size()) - 1;
    for (int l : g.linears) {
      const ir::Node& lin = graph.nodes()[static_cast<size_t>(l)];
      const ir::Value& out = graph.value(lin.outputs[0]);
      const int64_t end = start + out.shape.back();
      rw.set_map(lin.outputs[0], rw.emit("aten.slice_copy.Tensor", lin.name, {all},
                                         {{"dim", last}, {"start", start}, {"end", end}, {"step", int64_t{1}}},
                                         out.dtype, out.shape));
      start = end;
    }
  }
  return rw.finish();
}

}  // namespace kiln::passes
