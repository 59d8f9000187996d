// Row permutes across linears. A linear maps each row (its last dim) on its
// own, so a permute that keeps the last dim last commutes with it:
//   linear(permute(x))        == permute(linear(x))
//   permute(view(linear(a)))  == linear(permute(view(a)))
// nn.MultiheadAttention with batch_first transposes [B, S, E] to [S, B, E]
// before its input projection and back after its output projection; at
// batch > 1 each transpose is a copy kernel, and the one after the output
// projection keeps the residual add from becoming the GEMM's epilogue.
// Moving the first permute after the projection puts it where the attention
// step reads through strides (attention_layout.cpp); moving the second one
// before the output projection puts it where the attention step writes
// through strides (ops/attention_ops.cpp). A permute is only moved to the
// side where it costs no more: the smaller tensor, or one the attention
// step absorbs.
#include <map>
#include <set>

#include "ops/view_ops.h"
#include "passes/graph_queries.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

using Shape = std::vector<int64_t>;

constexpr const char* kLinear = "aten.linear.default";
constexpr const char* kPermute = "aten.permute_copy.default";
constexpr const char* kView = "aten.view_copy.default";

bool keeps_last_dim(const ir::Graph& graph, const ir::Node& p) {
  if (!ops::is_constant_permute_op(p.op) || p.inputs.size() != 1) return false;
  const size_t rank = graph.value(p.inputs[0]).shape.size();
  if (rank < 2) return false;
  const Shape perm = ops::permutation_of(p, rank);
  return perm.back() == static_cast<int64_t>(rank) - 1;
}

Shape permuted(const Shape& shape, const Shape& perm) {
  Shape out;
  for (int64_t p : perm) out.push_back(shape[static_cast<size_t>(p)]);
  return out;
}

struct Before {  // permute -> linear  becomes  linear -> permute
  int permute = -1;
};
struct After {  // linear -> [view] -> permute  becomes  [view] -> permute -> linear
  int view = -1, permute = -1;
};

}  // namespace

ir::Graph commute_linear_permutes(const ir::Graph& graph) {
  const auto consumers = consumers_of(graph);
  std::map<int, Before> before;  // by linear node
  std::map<int, After> after;
  std::set<int> skipped;  // permutes and views re-emitted elsewhere
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& lin = graph.nodes()[n];
    if (lin.op != kLinear || lin.inputs.size() < 2 || lin.outputs.size() != 1) continue;
    const Shape& w = graph.value(lin.inputs[1]).shape;
    if (w.size() != 2) continue;
    const int64_t n_out = w[0], k_in = w[1];
    // permute -> linear
    const int producer = graph.value(lin.inputs[0]).producer;
    if (producer >= 0 && !skipped.count(producer)) {
      const ir::Node& p = graph.nodes()[static_cast<size_t>(producer)];
      if (keeps_last_dim(graph, p) && sole_reader(graph, consumers, p.outputs[0]) == static_cast<int>(n) &&
          (n_out <= k_in || only_attention_reads(graph, consumers, lin.outputs[0]))) {
        before[static_cast<int>(n)] = {producer};
        skipped.insert(producer);
        continue;
      }
    }
    // linear -> [view] -> permute
    int next = sole_reader(graph, consumers, lin.outputs[0]);
    if (next < 0 || k_in > n_out) continue;
    After a;
    if (ops::is_view_op(graph.nodes()[static_cast<size_t>(next)].op)) {
      const ir::Node& v = graph.nodes()[static_cast<size_t>(next)];
      const Shape& vs = graph.value(v.outputs[0]).shape;
      const Shape& ls = graph.value(lin.outputs[0]).shape;
      if (vs.empty() || vs.back() != ls.back()) continue;  // the view must only regroup rows
      a.view = next;
      next = sole_reader(graph, consumers, v.outputs[0]);
      if (next < 0) continue;
    }
    if (!keeps_last_dim(graph, graph.nodes()[static_cast<size_t>(next)])) continue;
    a.permute = next;
    after[static_cast<int>(n)] = a;
    if (a.view >= 0) skipped.insert(a.view);
    skipped.insert(a.permute);
  }
  if (before.empty() && after.empty()) return graph;

  GraphRewriter rw(graph);
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    if (skipped.count(static_cast<int>(n)) || folded_to_constants(graph, node)) continue;
    std::vector<int> inputs;
    for (int in : node.inputs) inputs.push_back(rw.map(in));
    if (auto b = before.find(static_cast<int>(n)); b != before.end()) {
      const ir::Value& out = graph.value(node.outputs[0]);
      const ir::Node& p = graph.nodes()[static_cast<size_t>(b->second.permute)];
      const ir::Value& x = graph.value(p.inputs[0]);
      Shape rows = x.shape;
      rows.back() = out.shape.back();
      inputs[0] = rw.map(p.inputs[0]);
      const int y = rw.emit(kLinear, node.name, inputs, node.attrs, out.dtype, rows);
      const Shape perm = ops::permutation_of(p, x.shape.size());
      rw.set_map(node.outputs[0], rw.emit(kPermute, p.name, {y}, {{"dims", perm}}, out.dtype, out.shape));
      continue;
    }
    if (auto a = after.find(static_cast<int>(n)); a != after.end()) {
      const ir::Node& p = graph.nodes()[static_cast<size_t>(a->second.permute)];
      const ir::Value& pin = graph.value(p.inputs[0]);  // the rows as the permute sees them
      const ir::Value& x = graph.value(node.inputs[0]);
      Shape rows = pin.shape;
      rows.back() = x.shape.back();
      int y = inputs[0];
      if (x.shape != rows) y = rw.emit(kView, node.name + "_rows", {y}, {{"size", rows}}, x.dtype, rows);
      const Shape perm = ops::permutation_of(p, rows.size());
      y = rw.emit(kPermute, p.name, {y}, {{"dims", perm}}, x.dtype, permuted(rows, perm));
      inputs[0] = y;
      const ir::Value& pout = graph.value(p.outputs[0]);
      rw.set_map(p.outputs[0], rw.emit(kLinear, node.name, inputs, node.attrs, pout.dtype, pout.shape));
      continue;
    }
    rw.copy_node(node, inputs);
  }
  return rw.finish();
}

}  // namespace kiln::passes
