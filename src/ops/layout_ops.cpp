#include "ops/layout_ops.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <variant>

#include "ops/conv_ops.h"
#include "ops/dim_arg.h"
#include "ops/gemm_ops.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"

namespace kiln::ops {
namespace {


// `node`'s dim attribute value normalized (no 0-d tensor takes a dim here).
int64_t layout_dim(int64_t dim, size_t rank, const ir::Node& node) {
  int64_t d = 0;
  const std::string why = normalize_dim(dim, rank, "node '" + node.name + "':", &d, false);
  if (!why.empty()) throw CompileError(why);
  return d;
}

// Identity map over a contiguous tensor of `shape`.
AffineMap contiguous(const std::vector<int64_t>& shape) { return {0, ir::contiguous_strides(shape)}; }

PointwisePlan piece(int input, int out, std::vector<int64_t> iter_shape, AffineMap in_map,
                            AffineMap out_map) {
  PointwisePlan p;
  p.inputs = {input};
  p.out = out;
  p.iter_shape = std::move(iter_shape);
  p.input_map = std::move(in_map);
  p.output_map = std::move(out_map);
  return p;
}

// Where a layout kernel reads one of its inputs: element `offset` +
// sum(index_j * strides[j]) of `value`'s storage, over the dims of that input.
struct Source {
  int value = -1;
  int64_t offset = 0;
  std::vector<int64_t> strides;
};

Source contiguous_source(const ir::Value& v) { return {v.id, 0, ir::contiguous_strides(v.shape)}; }

constexpr const char* kSlice = "aten.slice_copy.Tensor";
constexpr const char* kSelect = "aten.select_copy.int";

// The farthest storage a layout node can read its input `value` from: back
// through the views, permutes, slices and selects that made it, as long as
// each result on the way is read only by the next (so the kernels computing
// them lose their only reader and fusion drops them), keeps `dtype` (a
// float16 permute of a float32 input converts once, either way), and each
// step can be described by strides (a view that would need a copy ends it:
// the kernel reads that view's own storage). permute -> view -> permute
// around a matrix product (a patch embedding's NCHW result read back as
// tokens) so becomes one kernel, or none where the result is the source's
// own order.
// `all_readers`: the caller reads `value` for every one of its readers (they are its own, absorbed
// nodes), so `value` may have several.
Source source_through_chain(PlanContext& ctx, int value, engine::DType dtype, bool all_readers = false) {
  const ir::Graph& g = ctx.graph();
  std::vector<int> chain;  // producer nodes, nearest first
  int root = value;
  // The value read itself may have several readers when it is a slice of
  // whole rows' last-dim columns (a merged projection's gate) and every
  // reader is elementwise arithmetic (silu(g) = g * sigmoid(g)): each kernel
  // then reads it in place, in contiguous runs, and the slice kernel loses
  // every reader.
  auto only_elementwise_readers = [&](int id) {
    const ir::Value& v = g.value(id);
    if (v.producer < 0) return false;
    const ir::Node& p = g.nodes()[static_cast<size_t>(v.producer)];
    if (p.op != kSlice || p.int_attr("step", 1) != 1 || p.inputs.size() != 1 ||
        layout_dim(p.int_attr("dim", 0), g.value(p.inputs[0]).shape.size(), p) !=
            static_cast<int64_t>(v.shape.size()) - 1)
      return false;
    return all_elementwise(g, ctx.consumers(id));
  };
  for (;;) {
    const ir::Value& v = g.value(root);
    const size_t readers = ctx.consumers(root).size();
    const bool readers_ok =
        readers == 1 || (root == value && readers > 1 && (all_readers || only_elementwise_readers(root)));
    if (v.producer < 0 || v.dtype != dtype || ctx.is_output(root) || !readers_ok) break;
    const ir::Node& p = g.nodes()[static_cast<size_t>(v.producer)];
    if (ctx.absorbed(v.producer) || p.inputs.size() != 1 || p.outputs.size() != 1) break;
    if (!is_view_op(p.op) && !is_constant_permute_op(p.op) && p.op != kSlice && p.op != kSelect) break;
    chain.push_back(v.producer);
    root = p.inputs[0];
  }
  Source s = contiguous_source(g.value(root));
  std::vector<int64_t> shape = g.value(root).shape;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const ir::Node& p = g.nodes()[static_cast<size_t>(*it)];
    const ir::Value& out = g.value(p.outputs[0]);
    if (is_view_op(p.op)) {
      if (auto st = view_strides(shape, s.strides, out.shape)) {
        s.strides = *st;
      } else {
        s = contiguous_source(out);
      }
    } else if (is_constant_permute_op(p.op)) {
      std::vector<int64_t> st;
      for (int64_t a : permutation_of(p, shape.size())) st.push_back(s.strides[static_cast<size_t>(a)]);
      s.strides = st;
    } else {
      const size_t d = static_cast<size_t>(layout_dim(p.int_attr("dim", 0), shape.size(), p));
      if (p.op == kSlice) {
        int64_t start = p.int_attr("start", 0);
        if (start < 0) start += shape[d];
        start = std::min(std::max<int64_t>(start, 0), shape[d]);
        s.offset += start * s.strides[d];
        s.strides[d] *= p.int_attr("step", 1);
      } else {
        int64_t index = p.int_attr("index", 0);
        if (index < -shape[d] || index >= shape[d])
          throw CompileError("node '" + p.name + "': index " + std::to_string(index) + " out of range for size " +
                             std::to_string(shape[d]));
        if (index < 0) index += shape[d];
        s.offset += index * s.strides[d];
        s.strides.erase(s.strides.begin() + static_cast<std::ptrdiff_t>(d));
      }
    }
    shape = out.shape;
    if (s.strides.size() != shape.size())
      throw CompileError("internal: node '" + p.name + "': strides do not match its output's rank");
  }
  return s;
}

// Whether a layout piece writes its output in the order it reads its
// source's storage, from its start and without gaps: an alias, not a kernel.
bool piece_keeps_order(const ir::Graph& graph, const PointwisePlan& p) {
  const ir::Value& in = graph.value(p.inputs.at(0));
  const ir::Value& out = graph.value(p.out);
  if (in.dtype != out.dtype || in.numel() != out.numel()) return false;
  if (p.input_map.base != 0 || p.output_map.base != 0) return false;
  if (!p.iter_shape.empty() && p.iter_shape != out.shape) return false;
  const std::vector<int64_t> own = ir::contiguous_strides(out.shape);
  if (p.input_map.coef.size() != own.size() || (!p.output_map.coef.empty() && p.output_map.coef != own)) return false;
  for (size_t j = 0; j < own.size(); ++j)
    if (out.shape[j] != 1 && p.input_map.coef[j] != own[j]) return false;
  return true;
}

// Whether `out` (a layout result in the element order of `root`) may alias
// root's storage. The engine describes a storage by one shape, root's, and
// checks it where a convolution reads (the exact shape) and where a GEMM
// reads (some trailing dims make one row, step_check.cpp): where `out` has
// another shape, no convolution may read it (or a view of it), a GEMM only
// if root's rows are out's, and it must not be a graph output (whose shape
// the storage would take).
bool alias_keeps_shapes(PlanContext& ctx, int out, int root) {
  const ir::Graph& g = ctx.graph();
  const std::vector<int64_t>& from = g.value(root).shape;
  const std::vector<int64_t>& to = g.value(out).shape;
  if (from == to) return true;
  auto row_sizes = [](const std::vector<int64_t>& shape) {
    std::set<int64_t> sizes;
    int64_t size = 1;
    for (size_t d = shape.size(); d-- > 0;) sizes.insert(size *= shape[d]);
    return sizes;
  };
  const std::set<int64_t> have = row_sizes(from);
  bool rows_kept = true;
  for (int64_t size : row_sizes(to)) rows_kept &= have.count(size) != 0;
  std::vector<int> pending = {out};
  while (!pending.empty()) {
    const int v = pending.back();
    pending.pop_back();
    if (ctx.is_output(v)) return false;
    for (int c : ctx.consumers(v)) {
      const ir::Node& reader = g.nodes()[static_cast<size_t>(c)];
      if (is_view_op(reader.op)) {
        pending.push_back(reader.outputs.at(0));
      } else if (reader.op == kConvNhwc || (is_gemm_op(reader.op) && !rows_kept)) {
        return false;
      }
    }
  }
  return true;
}

// The layout kernels computing `node`, each input read through `source`.
std::vector<PointwisePlan> plan_layout_from(const ir::Graph& graph, const ir::Node& node,
                                            const std::function<Source(int)>& source);

}  // namespace

bool is_layout_op(const std::string& op) {
  return is_constant_permute_op(op) || op == "aten.slice_copy.Tensor" || op == "aten.select_copy.int" ||
         op == "aten.cat.default" || op == "aten.split_with_sizes_copy.default" || op == "aten.split_copy.Tensor" ||
         op == "aten.repeat.default" || op == "aten.as_strided_copy.default";
}

namespace {

std::vector<int64_t> list_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return {};
  if (auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (auto* i = std::get_if<int64_t>(&it->second)) return {*i};
  throw CompileError(key + " must be a list of integers");
}

// repeat: the output's iteration as [r0, s0, r1, s1, ...] (the input shape
// padded on the left to the repeats' length): read (s...), write
// (r * s + s) along each dim.
std::string check_repeat(const OpQuery& q) {
  const std::vector<int64_t> repeats = list_attr(q.attrs, "repeats");
  const auto& in = q.inputs[0].shape;
  if (repeats.size() < in.size()) return "repeat needs at least one repeat count per input dim";
  std::vector<int64_t> expect;
  for (size_t j = 0; j < repeats.size(); ++j) {
    if (repeats[j] < 0) return "repeat counts must not be negative";
    const size_t lead = repeats.size() - in.size();
    expect.push_back(repeats[j] * (j < lead ? 1 : in[j - lead]));
  }
  if (expect != q.outputs[0].shape) return "repeat output does not match its repeat counts";
  return "";
}

// as_strided of a contiguous input: every element it reads lies inside the input.
std::string check_as_strided(const OpQuery& q) {
  const std::vector<int64_t> size = list_attr(q.attrs, "size"), stride = list_attr(q.attrs, "stride");
  if (size.size() != stride.size() || size != q.outputs[0].shape)
    return "as_strided size and stride must match the output's rank and shape";
  int64_t last = 0;
  auto it = q.attrs.find("storage_offset");
  if (it != q.attrs.end()) {
    auto* offset = std::get_if<int64_t>(&it->second);
    if (!offset || *offset < 0) return "as_strided storage_offset must be a non-negative integer";
    last = *offset;
  }
  if (ir::numel_of(size) == 0) return "";
  for (size_t j = 0; j < size.size(); ++j) {
    if (stride[j] < 0) return "as_strided with negative strides is not supported";
    last += (size[j] - 1) * stride[j];
  }
  if (last >= ir::numel_of(q.inputs[0].shape)) return "as_strided reads past the end of its input";
  return "";
}

// The [start, end) that a slice_scatter's start/end attributes (absent:
// 0 / the end; negative: from the end) give along a dim of `size`.
std::pair<int64_t, int64_t> scatter_range(const std::map<std::string, ir::Attr>& attrs, int64_t size) {
  auto get = [&](const char* key, int64_t fallback) {
    auto it = attrs.find(key);
    const int64_t* v = it == attrs.end() ? nullptr : std::get_if<int64_t>(&it->second);
    int64_t x = v ? *v : fallback;
    if (x < 0) x += size;
    return std::min(std::max<int64_t>(x, 0), size);
  };
  const int64_t start = get("start", 0);
  return {start, std::max(start, get("end", size))};
}

// copy(self, src): src broadcast to self's shape (functionalized in-place
// writes: `x[:, 0] = token`). slice_scatter(self, src, dim, start, end):
// self with [start, end) along dim replaced by src, step 1.
std::string check_scatter(const OpQuery& q) {
  if (q.inputs.size() != 2 || q.outputs.size() != 1) return q.op + " needs self, src and one output";
  const auto& self = q.inputs[0].shape;
  const auto& src = q.inputs[1].shape;
  if (q.outputs[0].shape != self) return q.op + " output shape differs from self's";
  if (q.op == "aten.copy.default") {
    if (src.size() > self.size()) return "copy from a source of higher rank";
    for (size_t j = 0; j < src.size(); ++j)
      if (src[j] != 1 && src[j] != self[self.size() - src.size() + j]) return "copy source does not broadcast to self";
    return "";
  }
  auto it = q.attrs.find("step");
  if (it != q.attrs.end()) {
    const int64_t* step = std::get_if<int64_t>(&it->second);
    if (step == nullptr || *step != 1) return "slice_scatter with a step other than 1 is not supported";
  }
  it = q.attrs.find("dim");
  const int64_t* dim = it == q.attrs.end() ? nullptr : std::get_if<int64_t>(&it->second);
  if (dim == nullptr) return "slice_scatter needs an integer dim";
  int64_t normalized = 0;
  const std::string why = normalize_dim(*dim, self.size(), "slice_scatter", &normalized, false);
  if (!why.empty()) return why;
  const size_t d = static_cast<size_t>(normalized);
  const auto [start, end] = scatter_range(q.attrs, self[d]);
  std::vector<int64_t> want = self;
  want[d] = end - start;
  if (src != want) return "slice_scatter source shape does not match the slice";
  return "";
}

}  // namespace

std::string check_layout(const OpQuery& q) {
  if (q.inputs.empty()) return q.op + " needs a tensor input";
  for (const auto& t : q.inputs)
    if (t.dtype != q.inputs[0].dtype) return q.op + " with inputs of different dtypes is not supported";
  for (const auto& t : q.outputs)
    if (t.dtype != q.inputs[0].dtype) return q.op + " that changes dtype is not supported";
  bool multi = q.op == "aten.split_with_sizes_copy.default" || q.op == "aten.split_copy.Tensor";
  if (!multi && q.outputs.size() != 1) return q.op + " with several outputs is not supported";
  if (q.op == "aten.copy.default" || q.op == "aten.slice_scatter.default") return check_scatter(q);
  if (q.op != "aten.cat.default" && q.inputs.size() != 1) return q.op + " needs exactly one tensor input";
  try {
    if (q.op == "aten.repeat.default") return check_repeat(q);
    if (q.op == "aten.as_strided_copy.default") return check_as_strided(q);
  } catch (const CompileError& e) {
    return q.op + ": " + e.what();
  }
  if (q.op == "aten.slice_copy.Tensor") {
    auto it = q.attrs.find("step");
    if (it != q.attrs.end()) {
      auto* step = std::get_if<int64_t>(&it->second);
      if (!step || *step < 1) return "slice step must be a positive integer";
    }
  }
  return "";
}

std::vector<PointwisePlan> plan_layout(const ir::Graph& graph, const ir::Node& node) {
  return plan_layout_from(graph, node, [&](int id) { return contiguous_source(graph.value(id)); });
}

namespace {

std::vector<PointwisePlan> plan_layout_from(const ir::Graph& graph, const ir::Node& node,
                                            const std::function<Source(int)>& source) {
  const ir::Value& in = graph.value(node.inputs.at(0));
  const std::string& op = node.op;
  // as_strided's strides address the input's storage itself.
  const Source src = op == "aten.as_strided_copy.default" ? contiguous_source(in) : source(in.id);
  const std::vector<int64_t>& in_strides = src.strides;
  if (is_constant_permute_op(op)) {  // of an activation (weights are folded)
    std::vector<int64_t> perm = permutation_of(node, in.shape.size());
    AffineMap map{src.offset, {}};
    for (int64_t p : perm) map.coef.push_back(in_strides[static_cast<size_t>(p)]);
    const ir::Value& out = graph.value(node.outputs[0]);
    return {piece(src.value, out.id, out.shape, map, contiguous(out.shape))};
  }
  if (op == "aten.slice_copy.Tensor") {
    const ir::Value& out = graph.value(node.outputs[0]);
    int64_t d = layout_dim(node.int_attr("dim", 0), in.shape.size(), node);
    int64_t size = in.shape[static_cast<size_t>(d)];
    int64_t start = node.int_attr("start", 0);
    if (start < 0) start += size;
    start = std::min(std::max<int64_t>(start, 0), size);
    int64_t step = node.int_attr("step", 1);
    AffineMap map{src.offset + start * in_strides[static_cast<size_t>(d)], in_strides};
    map.coef[static_cast<size_t>(d)] *= step;
    if (out.shape.size() != in.shape.size())
      throw CompileError("node '" + node.name + "': slice output rank differs from its input's");
    return {piece(src.value, out.id, out.shape, map, contiguous(out.shape))};
  }
  if (op == "aten.select_copy.int") {
    const ir::Value& out = graph.value(node.outputs[0]);
    int64_t d = layout_dim(node.int_attr("dim", 0), in.shape.size(), node);
    int64_t index = node.int_attr("index", 0);
    int64_t size = in.shape[static_cast<size_t>(d)];
    if (index < -size || index >= size)
      throw CompileError("node '" + node.name + "': index " + std::to_string(index) + " out of range for size " +
                         std::to_string(size));
    if (index < 0) index += size;
    AffineMap map{src.offset + index * in_strides[static_cast<size_t>(d)], {}};
    for (size_t j = 0; j < in.shape.size(); ++j)
      if (static_cast<int64_t>(j) != d) map.coef.push_back(in_strides[j]);
    return {piece(src.value, out.id, out.shape, map, contiguous(out.shape))};
  }
  if (op == "aten.repeat.default") {
    const ir::Value& out = graph.value(node.outputs[0]);
    const std::vector<int64_t> repeats = node.ints_attr("repeats");
    if (repeats.size() != out.shape.size() || repeats.size() < in.shape.size())
      throw CompileError("node '" + node.name + "': repeat counts do not match the output's rank");
    const std::vector<int64_t> out_strides = ir::contiguous_strides(out.shape);
    const size_t lead = repeats.size() - in.shape.size();
    std::vector<int64_t> iter;
    AffineMap read{src.offset, {}}, write;
    for (size_t j = 0; j < repeats.size(); ++j) {
      const int64_t s = j < lead ? 1 : in.shape[j - lead];
      if (repeats[j] * s != out.shape[j])
        throw CompileError("node '" + node.name + "': repeat output does not match its repeat counts");
      iter.insert(iter.end(), {repeats[j], s});
      read.coef.insert(read.coef.end(), {0, j < lead ? 0 : in_strides[j - lead]});
      write.coef.insert(write.coef.end(), {s * out_strides[j], out_strides[j]});
    }
    return {piece(src.value, out.id, iter, read, write)};
  }
  if (op == "aten.as_strided_copy.default") {
    const ir::Value& out = graph.value(node.outputs[0]);
    AffineMap read{node.int_attr("storage_offset", 0), node.ints_attr("stride")};
    if (read.coef.size() != out.shape.size())
      throw CompileError("node '" + node.name + "': as_strided strides do not match the output's rank");
    return {piece(in.id, out.id, out.shape, read, contiguous(out.shape))};
  }
  if (op == "aten.copy.default") {  // src broadcast to self's shape
    const ir::Value& out = graph.value(node.outputs[0]);
    const ir::Value& s = graph.value(node.inputs.at(1));
    const Source from = source(s.id);
    if (s.shape.size() > out.shape.size())
      throw CompileError("node '" + node.name + "': copy from a source of higher rank");
    AffineMap read{from.offset, std::vector<int64_t>(out.shape.size(), 0)};
    const size_t lead = out.shape.size() - s.shape.size();
    for (size_t j = 0; j < s.shape.size(); ++j)
      if (s.shape[j] != 1) read.coef[lead + j] = from.strides[j];
    return {piece(from.value, out.id, out.shape, read, contiguous(out.shape))};
  }
  if (op == "aten.slice_scatter.default") {  // self around the slice, src in it
    const ir::Value& out = graph.value(node.outputs[0]);
    const size_t d = static_cast<size_t>(layout_dim(node.int_attr("dim", 0), out.shape.size(), node));
    const auto [start, end] = scatter_range(node.attrs, out.shape[d]);
    const std::vector<int64_t> out_strides = ir::contiguous_strides(out.shape);
    std::vector<PointwisePlan> pieces;
    auto self_piece = [&](int64_t from, int64_t to) {
      if (to <= from) return;
      std::vector<int64_t> shape = out.shape;
      shape[d] = to - from;
      pieces.push_back(piece(src.value, out.id, shape, {src.offset + from * in_strides[d], in_strides},
                             {from * out_strides[d], out_strides}));
    };
    self_piece(0, start);
    const ir::Value& part = graph.value(node.inputs.at(1));
    if (part.numel() > 0) {
      const Source from = source(part.id);
      pieces.push_back(piece(from.value, out.id, part.shape, {from.offset, from.strides},
                             {start * out_strides[d], out_strides}));
    }
    self_piece(end, out.shape[d]);
    return pieces;
  }
  if (op == "aten.cat.default") {
    const ir::Value& out = graph.value(node.outputs[0]);
    int64_t d = layout_dim(node.int_attr("dim", 0), out.shape.size(), node);
    std::vector<int64_t> out_strides = ir::contiguous_strides(out.shape);
    std::vector<PointwisePlan> pieces;
    int64_t offset = 0;
    for (int id : node.inputs) {
      const ir::Value& part = graph.value(id);
      if (part.numel() == 0) continue;  // torch.cat skips empty inputs
      if (part.shape.size() != out.shape.size())
        throw CompileError("node '" + node.name + "': cat input '" + part.name + "' has rank " +
                           std::to_string(part.shape.size()) + ", output has " + std::to_string(out.shape.size()));
      AffineMap write{offset * out_strides[static_cast<size_t>(d)], out_strides};
      const Source part_src = source(id);
      pieces.push_back(piece(part_src.value, out.id, part.shape, {part_src.offset, part_src.strides}, write));
      offset += part.shape[static_cast<size_t>(d)];
    }
    if (offset != out.shape[static_cast<size_t>(d)])
      throw CompileError("node '" + node.name + "': cat inputs do not add up to the output along dim " +
                         std::to_string(d));
    return pieces;
  }
  // split: each output is a slice along `dim`.
  int64_t d = layout_dim(node.int_attr("dim", 0), in.shape.size(), node);
  std::vector<PointwisePlan> pieces;
  int64_t offset = 0;
  for (int id : node.outputs) {
    const ir::Value& out = graph.value(id);
    AffineMap read{src.offset + offset * in_strides[static_cast<size_t>(d)], in_strides};
    pieces.push_back(piece(src.value, id, out.shape, read, contiguous(out.shape)));
    offset += out.shape.at(static_cast<size_t>(d));
  }
  if (offset != in.shape[static_cast<size_t>(d)])
    throw CompileError("node '" + node.name + "': split sizes do not add up to the input along dim " +
                       std::to_string(d));
  return pieces;
}

}  // namespace

std::vector<uint8_t> evaluate_layout(const ir::Graph& graph, const ir::Node& node, const ir::Value& in) {
  std::vector<PointwisePlan> pieces = plan_layout(graph, node);
  if (pieces.size() != 1) throw CompileError("node '" + node.name + "': cannot evaluate at export");
  const PointwisePlan& p = pieces[0];
  const ir::Value& out = graph.value(p.out);
  const size_t elem = engine::dtype_size(in.dtype);
  if (out.dtype != in.dtype) throw CompileError("node '" + node.name + "': changes dtype");
  std::vector<uint8_t> data(out.nbytes());
  const std::vector<int64_t>& iter = p.iter_shape.empty() ? out.shape : p.iter_shape;
  const int64_t count = ir::numel_of(iter);
  std::vector<int64_t> idx(iter.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t src = p.input_map.base, dst = p.output_map.base;
    for (size_t j = 0; j < iter.size(); ++j) {
      src += idx[j] * p.input_map.coef.at(j);
      dst += idx[j] * p.output_map.coef.at(j);
    }
    if (src < 0 || src >= in.numel() || dst < 0 || dst >= out.numel())
      throw CompileError("node '" + node.name + "': element out of range");
    std::memcpy(data.data() + static_cast<size_t>(dst) * elem, in.data.data() + static_cast<size_t>(src) * elem, elem);
    for (size_t j = iter.size(); j-- > 0;) {
      if (++idx[j] < iter[j]) break;
      idx[j] = 0;
    }
  }
  return data;
}

bool strided_source(PlanContext& ctx, int value, int* storage, AffineMap* map, bool all_readers) {
  const ir::Graph& g = ctx.graph();
  const ir::Value& v = g.value(value);
  if (v.producer < 0 || ctx.absorbed(v.producer)) return false;
  // Views alone would alias; a permute, slice or select under them (Qwen3's per-head view of a
  // column slice of the merged q|k|v projection) is what a layout kernel would copy.
  int under = value;
  while (g.value(under).producer >= 0 && is_view_op(g.nodes()[static_cast<size_t>(g.value(under).producer)].op))
    under = g.nodes()[static_cast<size_t>(g.value(under).producer)].inputs.at(0);
  if (g.value(under).producer < 0) return false;
  const std::string& op = g.nodes()[static_cast<size_t>(g.value(under).producer)].op;
  if (!is_constant_permute_op(op) && op != kSlice && op != kSelect) return false;
  const Source s = source_through_chain(ctx, value, v.dtype, all_readers);
  if (s.value == value || s.strides.size() != v.shape.size()) return false;
  *storage = s.value;
  map->base = s.offset;
  map->coef = s.strides;
  return true;
}

// Permutes of constants are folded at export (passes/fold_constants.cpp), and
// so are repeats and as_strided of constants; what reaches fusion becomes
// layout kernels, one per piece, reading through the layout chain before it
// (source_through_chain), or an alias where the order is kept.
KILN_REGISTER_OPS(layout) {
  for (const char* name : {"aten.permute_copy.default", "aten.permute.default", "aten.t_copy.default", "aten.t.default",
                           "aten.transpose_copy.int", "aten.slice_copy.Tensor", "aten.select_copy.int",
                           "aten.cat.default", "aten.split_with_sizes_copy.default", "aten.split_copy.Tensor",
                           "aten.repeat.default", "aten.as_strided_copy.default", "aten.copy.default",
                           "aten.slice_scatter.default"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check_layout;
    def.any_dtype = true;  // moves elements: int64 ids, int32 and bool masks too
    def.plan = [](PlanContext& ctx, int node) {
      const ir::Graph& g = ctx.graph();
      const ir::Node& n = g.nodes()[static_cast<size_t>(node)];
      const engine::DType dtype = g.value(n.outputs.at(0)).dtype;
      std::vector<PointwisePlan> pieces =
          plan_layout_from(g, n, [&](int id) { return source_through_chain(ctx, id, dtype); });
      if (pieces.size() == 1 && n.outputs.size() == 1 && piece_keeps_order(g, pieces[0]) &&
          alias_keeps_shapes(ctx, n.outputs[0], pieces[0].inputs[0])) {
        ctx.alias(n.outputs[0], pieces[0].inputs[0]);
        return;
      }
      const std::string label = n.op.substr(5, n.op.find('.', 5) - 5);  // "aten.cat.default" -> "cat"
      for (PointwisePlan& piece : pieces) ctx.emit(PlannedOp(label, std::move(piece)));
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
