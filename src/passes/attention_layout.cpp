// Attention operands through strides (see ops/attention_ops.h): a query,
// key, value or mask reached from a root value through views, permutes and
// expands (the head split of a transformer: linear -> view -> permute) is
// read from the root with the strides those ops describe, and the permute or
// expand copies that nobody else reads are dropped. Runs just before fusion.
#include <algorithm>
#include <optional>

#include "ops/attention_ops.h"
#include "ops/dim_arg.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"
#include "passes/graph_queries.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

using Shape = std::vector<int64_t>;

constexpr const char* kExpand = "aten.expand_copy.default";
const char* kOperands[] = {"q", "k", "v", "mask"};


constexpr const char* kSlice = "aten.slice_copy.Tensor";
constexpr const char* kSelect = "aten.select_copy.int";

struct Layout {
  Shape shape, strides;
  int64_t offset = 0;
  int64_t group = 1;
};

// One stride per dim, except that the head dim (1) of a 4-D key or value
// may be [kv heads, n] with n broadcast (stride 0): grouped-query attention,
// head h reads kv head h / n.
std::optional<Layout> to_layout(const ops::FactoredDims& dims, int64_t offset) {
  Layout layout{ops::factored_shape(dims), {}, offset, 1};
  for (size_t d = 0; d < dims.size(); ++d) {
    ops::FactoredDims one{dims[d]};
    if (auto st = ops::plain_strides(one)) {
      layout.strides.push_back((*st)[0]);
    } else if (d == 1 && dims.size() == 4 && dims[d].size() == 2 && dims[d][1].stride == 0) {
      layout.group = dims[d][1].size;
      layout.strides.push_back(dims[d][0].stride);
    } else {
      return std::nullopt;
    }
  }
  return layout;
}

// The single factor of dim d (merged), if it has one.
std::optional<ops::StrideFactor> sole_factor(const ops::FactoredDims& dims, size_t d, int64_t size) {
  ops::FactoredDims one{dims[d]};
  auto st = ops::plain_strides(one);
  if (!st) return std::nullopt;
  return ops::StrideFactor{size, (*st)[0]};
}

// The layout of the value at the end of `chain` (producers, nearest first)
// in the storage of `root` (the first node's input), when the copies and
// views of the chain can be described by strides (dims made of several
// strided factors are allowed on the way: see ops::FactoredDims). An operand
// of rank 3 with "heads_split" is read in its 4-D form `target4`.
std::optional<Layout> layout_through(const ir::Graph& graph, const std::vector<int>& chain, int root,
                                     const Shape& operand, const Shape& target4) {
  Shape shape = graph.value(root).shape;
  ops::FactoredDims dims = ops::factored_dims(shape, ir::contiguous_strides(shape));
  int64_t offset = 0;  // elements, from slices and selects
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const ir::Node& p = graph.nodes()[static_cast<size_t>(*it)];
    const Shape& out = graph.value(p.outputs[0]).shape;
    if (ops::is_constant_permute_op(p.op)) {
      const Shape perm = ops::permutation_of(p, shape.size());
      ops::FactoredDims next(perm.size());
      for (size_t j = 0; j < perm.size(); ++j) next[j] = dims[static_cast<size_t>(perm[j])];
      dims = next;
    } else if (p.op == kExpand) {
      if (out.size() < shape.size()) return std::nullopt;
      const size_t lead = out.size() - shape.size();
      ops::FactoredDims next(out.size());
      for (size_t j = 0; j < out.size(); ++j) {
        if (j >= lead && shape[j - lead] == out[j]) {
          next[j] = dims[j - lead];
        } else if (out[j] != 1) {
          next[j] = {{out[j], 0}};
        }
      }
      dims = next;
    } else if (p.op == kSlice || p.op == kSelect) {
      int64_t d = 0;  // a dim out of range: not a view this pass can follow
      if (!ops::normalize_dim(p.int_attr("dim", 0), shape.size(), p.op, &d, false).empty()) return std::nullopt;
      const size_t du = static_cast<size_t>(d);
      auto f = sole_factor(dims, du, shape[du]);
      if (!f) return std::nullopt;
      if (p.op == kSelect) {
        int64_t index = p.int_attr("index", 0);
        if (index < 0) index += shape[du];
        offset += index * f->stride;
        dims.erase(dims.begin() + d);
      } else {
        int64_t start = p.int_attr("start", 0), step = p.int_attr("step", 1);
        if (start < 0) start += shape[du];
        start = std::max<int64_t>(0, std::min(start, shape[du]));
        offset += start * f->stride;
        dims[du].clear();
        if (out[du] != 1) dims[du].push_back({out[du], f->stride * step});
      }
      if (dims.size() != out.size()) return std::nullopt;
    } else if (ops::is_identity_copy(graph, p)) {
      // a copy with the same shape: the same elements
    } else if (auto next = ops::view_factored(dims, out)) {
      dims = *next;
    } else {
      return std::nullopt;
    }
    shape = out;
  }
  if (shape != operand) return std::nullopt;
  if (!target4.empty()) {
    if (auto split = ops::view_factored(dims, target4)) return to_layout(*split, offset);
    return std::nullopt;
  }
  return to_layout(dims, offset);
}

// A constant key given transposed: an attention over learned keys (cross-
// attention to latents or query slots) reaches fusion as Q @ K^T with K^T
// folded into a [.., dim, keys] constant at export. The kernels read a key's
// head dim contiguously, so the constant is stored [.., keys, dim] instead
// (a new constant; other readers keep the old one).
void untranspose_constant_keys(ir::Graph& graph) {
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    if (!ops::is_attention_op(node.op) || node.inputs.size() < 2 || node.int_attr("k_transposed", 0) == 0 ||
        node.has_attr("k_strides"))
      continue;
    const ir::Value& kt = graph.value(node.inputs[1]);
    if (!kt.is_constant || kt.shape.size() < 2) continue;
    const size_t rank = kt.shape.size();
    std::vector<int64_t> swap_last(rank);
    for (size_t d = 0; d < rank; ++d) swap_last[d] = static_cast<int64_t>(d);
    std::swap(swap_last[rank - 1], swap_last[rank - 2]);
    Shape shape = kt.shape;
    std::swap(shape[rank - 1], shape[rank - 2]);
    const int k = graph.add_constant(kt.name + "_key_rows", kt.dtype, std::move(shape),
                                     permute_constant_data(kt, swap_last));
    ir::Node& fused = graph.nodes()[n];
    fused.inputs[1] = k;
    fused.attrs.erase("k_transposed");
  }
}

}  // namespace

void attention_operand_layouts(ir::Graph& graph) {
  untranspose_constant_keys(graph);
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
        if (!(ops::is_view_op(p.op) || is_layout_copy(graph, p)) || p.inputs.empty()) break;
        chain.push_back(producer);
        root = p.inputs[0];
      }
      // The farthest root the operand can be read from through strides.
      const Shape& operand = graph.value(node.inputs[i]).shape;
      Shape target4;
      if (node.has_attr("heads_split") && operand.size() == 3 && name != "mask") {
        const Shape split = node.ints_attr("heads_split");
        target4 = {split.at(0), split.at(1), operand[1], operand[2]};
      }
      std::optional<Layout> found;
      for (size_t k = chain.size(); k >= 1 && !found; --k) {
        const std::vector<int> sub(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(k));
        bool has_copy = false;
        for (int c : sub) has_copy |= is_layout_copy(graph, graph.nodes()[static_cast<size_t>(c)]);
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
      if (node.op == "kiln.folded" || !(ops::is_view_op(node.op) || is_layout_copy(graph, node))) continue;
      bool used = false;
      for (int o : node.outputs) used |= is_used(graph, consumers, o);
      if (used) continue;
      node.op = "kiln.folded";
      dropped = true;
    }
  }
}

}  // namespace kiln::passes
