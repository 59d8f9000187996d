#include "ops/layout_ops.h"

#include <algorithm>

#include "ops/op_registry.h"
#include "ops/view_ops.h"

namespace kiln::ops {
namespace {

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

int64_t normalize_dim(int64_t dim, size_t rank, const ir::Node& node) {
  int64_t r = static_cast<int64_t>(rank);
  if (dim < -r || dim >= r)
    throw CompileError("node '" + node.name + "': dimension " + std::to_string(dim) + " out of range for rank " +
                       std::to_string(rank));
  return dim < 0 ? dim + r : dim;
}

// Identity map over a contiguous tensor of `shape`.
AffineMap contiguous(const std::vector<int64_t>& shape) { return {0, strides_of(shape)}; }

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

}  // namespace

bool is_layout_op(const std::string& op) {
  return is_constant_permute_op(op) || op == "aten.slice_copy.Tensor" || op == "aten.select_copy.int" ||
         op == "aten.cat.default" || op == "aten.split_with_sizes_copy.default" || op == "aten.split_copy.Tensor";
}

std::string check_layout(const OpQuery& q) {
  if (q.inputs.empty()) return q.op + " needs a tensor input";
  for (const auto& t : q.inputs)
    if (t.dtype != q.inputs[0].dtype) return q.op + " with inputs of different dtypes is not supported";
  for (const auto& t : q.outputs)
    if (t.dtype != q.inputs[0].dtype) return q.op + " that changes dtype is not supported";
  bool multi = q.op == "aten.split_with_sizes_copy.default" || q.op == "aten.split_copy.Tensor";
  if (!multi && q.outputs.size() != 1) return q.op + " with several outputs is not supported";
  if (q.op != "aten.cat.default" && q.inputs.size() != 1) return q.op + " needs exactly one tensor input";
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
  const ir::Value& in = graph.value(node.inputs.at(0));
  const std::vector<int64_t> in_strides = strides_of(in.shape);
  const std::string& op = node.op;
  if (is_constant_permute_op(op)) {  // of an activation (weights are folded)
    std::vector<int64_t> perm = permutation_of(node, in.shape.size());
    AffineMap map;
    for (int64_t p : perm) map.coef.push_back(in_strides[static_cast<size_t>(p)]);
    const ir::Value& out = graph.value(node.outputs[0]);
    return {piece(in.id, out.id, out.shape, map, contiguous(out.shape))};
  }
  if (op == "aten.slice_copy.Tensor") {
    const ir::Value& out = graph.value(node.outputs[0]);
    int64_t d = normalize_dim(node.int_attr("dim", 0), in.shape.size(), node);
    int64_t size = in.shape[static_cast<size_t>(d)];
    int64_t start = node.int_attr("start", 0);
    if (start < 0) start += size;
    start = std::min(std::max<int64_t>(start, 0), size);
    int64_t step = node.int_attr("step", 1);
    AffineMap map{start * in_strides[static_cast<size_t>(d)], in_strides};
    map.coef[static_cast<size_t>(d)] *= step;
    if (out.shape.size() != in.shape.size())
      throw CompileError("node '" + node.name + "': slice output rank differs from its input's");
    return {piece(in.id, out.id, out.shape, map, contiguous(out.shape))};
  }
  if (op == "aten.select_copy.int") {
    const ir::Value& out = graph.value(node.outputs[0]);
    int64_t d = normalize_dim(node.int_attr("dim", 0), in.shape.size(), node);
    int64_t index = node.int_attr("index", 0);
    int64_t size = in.shape[static_cast<size_t>(d)];
    if (index < -size || index >= size)
      throw CompileError("node '" + node.name + "': index " + std::to_string(index) + " out of range for size " +
                         std::to_string(size));
    if (index < 0) index += size;
    AffineMap map{index * in_strides[static_cast<size_t>(d)], {}};
    for (size_t j = 0; j < in.shape.size(); ++j)
      if (static_cast<int64_t>(j) != d) map.coef.push_back(in_strides[j]);
    return {piece(in.id, out.id, out.shape, map, contiguous(out.shape))};
  }
  if (op == "aten.cat.default") {
    const ir::Value& out = graph.value(node.outputs[0]);
    int64_t d = normalize_dim(node.int_attr("dim", 0), out.shape.size(), node);
    std::vector<int64_t> out_strides = strides_of(out.shape);
    std::vector<PointwisePlan> pieces;
    int64_t offset = 0;
    for (int id : node.inputs) {
      const ir::Value& part = graph.value(id);
      if (part.numel() == 0) continue;  // torch.cat skips empty inputs
      if (part.shape.size() != out.shape.size())
        throw CompileError("node '" + node.name + "': cat input '" + part.name + "' has rank " +
                           std::to_string(part.shape.size()) + ", output has " + std::to_string(out.shape.size()));
      AffineMap write{offset * out_strides[static_cast<size_t>(d)], out_strides};
      pieces.push_back(piece(id, out.id, part.shape, contiguous(part.shape), write));
      offset += part.shape[static_cast<size_t>(d)];
    }
    if (offset != out.shape[static_cast<size_t>(d)])
      throw CompileError("node '" + node.name + "': cat inputs do not add up to the output along dim " +
                         std::to_string(d));
    return pieces;
  }
  // split: each output is a slice along `dim`.
  int64_t d = normalize_dim(node.int_attr("dim", 0), in.shape.size(), node);
  std::vector<PointwisePlan> pieces;
  int64_t offset = 0;
  for (int id : node.outputs) {
    const ir::Value& out = graph.value(id);
    AffineMap read{offset * in_strides[static_cast<size_t>(d)], in_strides};
    pieces.push_back(piece(in.id, id, out.shape, read, contiguous(out.shape)));
    offset += out.shape.at(static_cast<size_t>(d));
  }
  if (offset != in.shape[static_cast<size_t>(d)])
    throw CompileError("node '" + node.name + "': split sizes do not add up to the input along dim " +
                       std::to_string(d));
  return pieces;
}

// Permutes of constants are folded at export (passes/fold_constants.cpp);
// what reaches fusion becomes layout kernels, one per piece.
KILN_REGISTER_OPS(layout) {
  for (const char* name : {"aten.permute_copy.default", "aten.permute.default", "aten.t_copy.default", "aten.t.default",
                           "aten.transpose_copy.int", "aten.slice_copy.Tensor", "aten.select_copy.int",
                           "aten.cat.default", "aten.split_with_sizes_copy.default", "aten.split_copy.Tensor"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check_layout;
    def.plan = [](PlanContext& ctx, int node) {
      const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
      const std::string label = n.op.substr(5, n.op.find('.', 5) - 5);  // "aten.cat.default" -> "cat"
      for (PointwisePlan& piece : plan_layout(ctx.graph(), n)) ctx.emit(PlannedOp(label, std::move(piece)));
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
