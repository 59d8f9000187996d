// Attention operands through strides (see ops/attention_ops.h): a query,
// key, value or mask reached from a root value through views, permutes and
// expands (the head split of a transformer: linear -> view -> permute) is
// read from the root with the strides those ops describe, and the permute or
// expand copies that nobody else reads are dropped. Runs just before fusion.
#include <algorithm>
#include <optional>

#include "ops/attention_ops.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

using Shape = std::vector<int64_t>;

constexpr const char* kExpand = "aten.expand_copy.default";
const char* kOperands[] = {"q", "k", "v", "mask"};


constexpr const char* kSlice = "aten.slice_copy.Tensor";
constexpr const char* kSelect = "aten.select_copy.int";

bool is_copy_op(const ir::Graph& graph, const ir::Node& node) {
  const std::string& op = node.op;
  return ops::is_constant_permute_op(op) || op == kExpand || op == kSlice || op == kSelect ||
         ops::is_identity_copy(graph, node);
}

int64_t normalize_dim(int64_t dim, size_t rank) { return dim < 0 ? dim + static_cast<int64_t>(rank) : dim; }

struct Layout {
  Shape shape, strides;
  int64_t offset = 0;
  int64_t group = 1;
};

// The layout of the value at the end of `chain` (producers, nearest first)
// in the storage of `root` (the first node's input), when the copies and
// views of the chain can be described by strides. An operand of rank 3 with
// "heads_split" may end at its 4-D form (only views after it).
std::optional<Layout> layout_through(const ir::Graph& graph, const std::vector<int>& chain, int root,
                                     const Shape& operand, const Shape& target4) {
  Shape shape = graph.value(root).shape, strides = ir::contiguous_strides(shape);
  int64_t offset = 0;  // elements, from slices and selects
  Shape good_shape, good_strides;  // the last 4-D state matching target4
  int64_t group = 1, good_group = 1;  // heads sharing one key/value head (dim 1)
  bool ok = true, views_only_since_good = false;
  for (auto it = chain.rbegin(); it != chain.rend() && ok; ++it) {
    const ir::Node& p = graph.nodes()[static_cast<size_t>(*it)];
    const Shape& out = graph.value(p.outputs[0]).shape;
    if (!good_shape.empty() && !ops::is_view_op(p.op)) views_only_since_good = false;
    if (ops::is_constant_permute_op(p.op)) {
      const Shape perm = ops::permutation_of(p, shape.size());
      if (group > 1 && (perm[0] != 0 || perm[1] != 1)) { ok = false; break; }
      Shape st(perm.size());
      for (size_t j = 0; j < perm.size(); ++j) st[j] = strides[static_cast<size_t>(perm[j])];
      strides = st;
    } else if (p.op == kExpand) {
      if (out.size() < shape.size() || (group > 1 && out != shape)) { ok = false; break; }
      const size_t lead = out.size() - shape.size();
      Shape st(out.size(), 0);
      for (size_t j = lead; j < out.size(); ++j)
        st[j] = shape[j - lead] == out[j] ? strides[j - lead] : 0;
      strides = st;
    } else if (p.op == kSlice || p.op == kSelect) {
      const int64_t d = normalize_dim(p.int_attr("dim", 0), shape.size());
      if (d < 0 || d >= static_cast<int64_t>(shape.size())) { ok = false; break; }
      const size_t du = static_cast<size_t>(d);
      if (p.op == kSelect) {
        int64_t index = p.int_attr("index", 0);
        if (index < 0) index += shape[du];
        offset += index * strides[du];
        strides.erase(strides.begin() + d);
      } else {
        int64_t start = p.int_attr("start", 0), step = p.int_attr("step", 1);
        if (start < 0) start += shape[du];
        start = std::max<int64_t>(0, std::min(start, shape[du]));
        offset += start * strides[du];
        strides[du] *= step;
      }
      if (strides.size() != out.size()) { ok = false; break; }
    } else if (ops::is_identity_copy(graph, p)) {
      // a copy with the same shape: the same elements
    } else if (group > 1) {
      ok = false;  // only permutes of the trailing dims keep the head grouping
    } else if (auto st = ops::view_strides(shape, strides, out)) {
      strides = *st;
    } else if (shape.size() == 5 && out.size() == 4 && strides[2] == 0 && out[0] == shape[0] &&
               out[1] == shape[1] * shape[2] && out[2] == shape[3] && out[3] == shape[4]) {
      // Grouped-query attention: [b, kv heads, n, s, d] broadcast over n
      // and merged to [b, kv heads * n, s, d]: head h reads kv head h / n.
      group = shape[2];
      strides = {strides[0], strides[1], strides[3], strides[4]};
    } else {
      ok = false;
    }
    shape = out;
    if (ok && !target4.empty() && shape == target4) {
      good_shape = shape;
      good_group = group;
      good_strides = strides;
      views_only_since_good = true;
    }
  }
  if (!ok || shape != operand) {
    if (good_shape.empty() || !views_only_since_good) return std::nullopt;
    shape = good_shape;
    group = good_group;
    strides = good_strides;
  }
  return Layout{shape, strides, offset, group};
}

}  // namespace

void attention_operand_layouts(ir::Graph& graph) {
  bool changed = false;
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    if (!ops::is_attention_op(graph.nodes()[n].op)) continue;
    for (size_t i = 0; i < graph.nodes()[n].inputs.size() && i < 4; ++i) {
      ir::Node& node = graph.nodes()[n];
      const std::string name = kOperands[i];
      if (node.has_attr(name + "_strides")) continue;
      // Walk back to the root through ops that only re-describe memory.
      std::vector<int> chain;
      int root = node.inputs[i];
      for (;;) {
        const int producer = graph.value(root).producer;
        if (producer < 0) break;
        const ir::Node& p = graph.nodes()[static_cast<size_t>(producer)];
        if (!(ops::is_view_op(p.op) || is_copy_op(graph, p)) || p.inputs.empty()) break;
        chain.push_back(producer);
        root = p.inputs[0];
      }
      // The farthest root the operand can be read from through strides.
      const Shape& operand = graph.value(node.inputs[i]).shape;
      Shape target4;
      if (node.has_attr("heads_split") && operand.size() == 3) {
        const Shape split = node.ints_attr("heads_split");
        target4 = {split.at(0), split.at(1), operand[1], operand[2]};
      }
      std::optional<Layout> found;
      for (size_t k = chain.size(); k >= 1 && !found; --k) {
        const std::vector<int> sub(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(k));
        bool has_copy = false;
        for (int c : sub) has_copy |= is_copy_op(graph, graph.nodes()[static_cast<size_t>(c)]);
        if (!has_copy) break;  // views alone cost nothing
        root = graph.nodes()[static_cast<size_t>(sub.back())].inputs[0];
        found = layout_through(graph, sub, root, operand, target4);
      }
      if (!found) continue;
      const Shape& shape = found->shape;
      const Shape& strides = found->strides;
      const int64_t group = found->group, offset = found->offset;
      // The dim the kernel reads contiguously: the head dim (keys for K^T).
      const bool transposed = name == "k" && node.int_attr("k_transposed", 0) != 0;
      const size_t inner = shape.size() - (transposed ? 2 : 1);
      if (name != "mask" && shape[inner] != 1 && strides[inner] != 1) continue;
      node.inputs[i] = root;
      node.attrs[name + "_shape"] = shape;
      node.attrs[name + "_strides"] = strides;
      if (group > 1) node.attrs[name + "_group"] = group;
      if (offset != 0) node.attrs[name + "_offset"] = offset;
      changed = true;
    }
  }
  if (!changed) return;
  // Drop the copies (and views) nobody reads any more, last first.
  for (bool dropped = true; dropped;) {
    dropped = false;
    const auto consumers = consumers_of(graph);
    for (size_t n = graph.nodes().size(); n-- > 0;) {
      ir::Node& node = graph.nodes()[n];
      if (node.op == "kiln.folded" || !(ops::is_view_op(node.op) || is_copy_op(graph, node))) continue;
      bool used = false;
      for (int o : node.outputs) used |= is_used(graph, consumers, o);
      if (used) continue;
      node.op = "kiln.folded";
      dropped = true;
    }
  }
}

}  // namespace kiln::passes
