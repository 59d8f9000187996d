// A helper for passes that rebuild the graph node by node (the IR appends
// nodes, so rewrites that insert or replace nodes build a new graph in
// topological order): inputs and constants are copied first, then the pass
// emits nodes into `out`, mapping old value ids to new ones.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

class GraphRewriter {
 public:
  // Copies `src`'s inputs and constants into the new graph; map() gives
  // their new ids.
  explicit GraphRewriter(const ir::Graph& src) : src_(src), map_(src.values().size(), -1) {
    for (int id : src.inputs()) {
      const ir::Value& v = src.value(id);
      map_[static_cast<size_t>(id)] = out_.add_input(v.name, v.dtype, v.shape);
    }
    for (const ir::Value& v : src.values())
      if (v.is_constant) map_[static_cast<size_t>(v.id)] = out_.add_constant(v.name, v.dtype, v.shape, v.data);
    for (const ir::State& s : src.states()) {
      const ir::Value& v = src.value(s.value);
      map_[static_cast<size_t>(s.value)] = out_.add_state(v.name, v.dtype, v.shape, s.key, v.data);
    }
  }

  ir::Graph& out() { return out_; }
  const ir::Graph& src() const { return src_; }

  int map(int old_id) const { return map_.at(static_cast<size_t>(old_id)); }
  void set_map(int old_id, int new_id) { map_.at(static_cast<size_t>(old_id)) = new_id; }

  // Emits a node with one output; returns the output's new value id.
  int emit(const std::string& op, const std::string& name, std::vector<int> inputs, std::map<std::string, ir::Attr> attrs,
           engine::DType dtype, std::vector<int64_t> shape) {
    int node = out_.add_node(op, name, std::move(inputs), std::move(attrs), {{dtype, std::move(shape)}});
    return out_.nodes()[static_cast<size_t>(node)].outputs[0];
  }

  // Emits `node` unchanged but for its (already mapped) inputs; maps its outputs.
  void copy_node(const ir::Node& node, std::vector<int> inputs) {
    std::vector<std::pair<engine::DType, std::vector<int64_t>>> types;
    for (int o : node.outputs) types.emplace_back(src_.value(o).dtype, src_.value(o).shape);
    int index = out_.add_node(node.op, node.name, std::move(inputs), node.attrs, types);
    for (size_t i = 0; i < node.outputs.size(); ++i)
      map_[static_cast<size_t>(node.outputs[i])] = out_.nodes()[static_cast<size_t>(index)].outputs[i];
  }

  // Maps the source graph's outputs and hands over the rebuilt graph
  // (call once, last).
  ir::Graph finish() {
    std::vector<int> outputs;
    for (int o : src_.outputs()) outputs.push_back(map(o));
    out_.set_outputs(std::move(outputs));
    for (const ir::State& s : src_.states())
      if (s.update >= 0) out_.set_state_update(map(s.value), map(s.update));
    return std::move(out_);
  }

  int add_constant(const std::string& name, engine::DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> data) {
    return out_.add_constant(name, dtype, std::move(shape), std::move(data));
  }

 private:
  const ir::Graph& src_;
  ir::Graph out_;
  std::vector<int> map_;
};

// A node fold_constants evaluated: its outputs are constants, which the
// GraphRewriter copies as such, so a rebuilding pass skips the node
// (copying it would re-map its outputs to values without data).
inline bool folded_to_constants(const ir::Graph& graph, const ir::Node& node) {
  if (node.op != "kiln.folded") return false;
  for (int o : node.outputs)
    if (!graph.value(o).is_constant) return false;
  return true;
}

// consumers[v]: indices of the (non-folded) nodes reading value v.
inline std::vector<std::vector<int>> consumers_of(const ir::Graph& graph) {
  std::vector<std::vector<int>> consumers(graph.values().size());
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    if (node.op == "kiln.folded") continue;
    for (int in : node.inputs) consumers[static_cast<size_t>(in)].push_back(static_cast<int>(n));
  }
  return consumers;
}

// Whether v is used at all: read by a node or a graph output.
inline bool is_used(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v) {
  if (!consumers[static_cast<size_t>(v)].empty()) return true;
  for (int o : graph.outputs())
    if (o == v) return true;
  return false;
}

// Row-major permute of constant bytes: output dim j is input dim perm[j].
std::vector<uint8_t> permute_constant_data(const ir::Value& in, const std::vector<int64_t>& perm);

}  // namespace kiln::passes
