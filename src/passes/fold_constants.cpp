// Constant folding: weight transposes and views of constants are done once at
// export, so the engine reads weights in the layout the GEMM wants; repeats
// and as_strided of constants (instance norm's repeated affine parameters)
// are evaluated through their layout plans.
#include <cstring>

#include "ops/layout_ops.h"
#include "ops/view_ops.h"
#include "passes/dtype_convert.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {

// out[i_0..i_r] = in[i_perm^-1...]: output dim j is input dim perm[j].
std::vector<uint8_t> permute_constant_data(const ir::Value& in, const std::vector<int64_t>& perm) {
  size_t rank = in.shape.size();
  size_t elem = engine::dtype_size(in.dtype);
  std::vector<int64_t> in_strides(rank, 1);
  for (size_t d = rank; d-- > 1;) in_strides[d - 1] = in_strides[d] * in.shape[d];
  std::vector<int64_t> out_shape(rank);
  for (size_t j = 0; j < rank; ++j) out_shape[j] = in.shape[static_cast<size_t>(perm[j])];
  int64_t n = in.numel();
  std::vector<uint8_t> out(in.data.size());
  std::vector<int64_t> idx(rank, 0);
  for (int64_t o = 0; o < n; ++o) {
    int64_t src = 0;
    for (size_t j = 0; j < rank; ++j) src += idx[j] * in_strides[static_cast<size_t>(perm[j])];
    std::memcpy(out.data() + static_cast<size_t>(o) * elem, in.data.data() + static_cast<size_t>(src) * elem, elem);
    for (size_t j = rank; j-- > 0;) {
      if (++idx[j] < out_shape[j]) break;
      idx[j] = 0;
    }
  }
  return out;
}

namespace {

// Expanded constants are stored whole, so only small ones are folded.
constexpr size_t kMaxExpandedBytes = size_t{4} << 20;

std::vector<uint8_t> broadcast_constant_data(const ir::Value& in, const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size(), lead = rank - in.shape.size();
  const size_t elem = engine::dtype_size(in.dtype);
  const std::vector<int64_t> in_strides = ir::contiguous_strides(in.shape);
  std::vector<int64_t> src_strides(rank, 0);  // 0 along broadcast dims
  for (size_t j = lead; j < rank; ++j)
    if (in.shape[j - lead] != 1) src_strides[j] = in_strides[j - lead];
  const int64_t count = ir::numel_of(out_shape);
  std::vector<uint8_t> out(static_cast<size_t>(count) * elem);
  std::vector<int64_t> idx(rank, 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t src = 0;
    for (size_t j = 0; j < rank; ++j) src += idx[j] * src_strides[j];
    std::memcpy(out.data() + static_cast<size_t>(i) * elem, in.data.data() + static_cast<size_t>(src) * elem, elem);
    for (size_t j = rank; j-- > 0;) {
      if (++idx[j] < out_shape[j]) break;
      idx[j] = 0;
    }
  }
  return out;
}

}  // namespace

bool folds_view_of_constant(const std::string& op) {
  return ops::is_constant_permute_op(op) || ops::is_view_op(op);
}

void fold_constants(ir::Graph& graph) {
  for (ir::Node& node : graph.nodes()) {
    if (node.inputs.size() != 1 || node.outputs.size() != 1) continue;
    if (node.op == "aten._to_copy.default" && graph.value(node.inputs[0]).is_constant) {
      // A cast of a constant (often an integer scalar lifted by export).
      const ir::Value& in = graph.value(node.inputs[0]);
      ir::Value& out = graph.value(node.outputs[0]);
      out.data = convert_float_data(in.data, in.dtype, out.dtype);
      out.is_constant = true;
      out.producer = -1;
      node.op = "kiln.folded";
      continue;
    }
    if ((node.op == "aten.repeat.default" || node.op == "aten.as_strided_copy.default") &&
        graph.value(node.inputs[0]).is_constant) {
      std::vector<uint8_t> data = ops::evaluate_layout(graph, node, graph.value(node.inputs[0]));
      ir::Value& out = graph.value(node.outputs[0]);
      out.data = std::move(data);
      out.is_constant = true;
      out.producer = -1;
      node.op = "kiln.folded";
      continue;
    }
    if (node.op == "aten.expand_copy.default" && graph.value(node.inputs[0]).is_constant &&
        graph.value(node.outputs[0]).nbytes() <= kMaxExpandedBytes) {
      // A broadcast constant (ViT's class token expanded over the batch).
      const ir::Value& in = graph.value(node.inputs[0]);
      ir::Value& out = graph.value(node.outputs[0]);
      out.data = broadcast_constant_data(in, out.shape);
      out.is_constant = true;
      out.producer = -1;
      node.op = "kiln.folded";
      continue;
    }
    if (!folds_view_of_constant(node.op)) continue;
    const bool permute = ops::is_constant_permute_op(node.op);
    const ir::Value& in = graph.value(node.inputs[0]);
    if (!in.is_constant) continue;
    ir::Value& out = graph.value(node.outputs[0]);
    if (out.numel() != in.numel() || out.dtype != in.dtype)
      throw CompileError("node '" + node.name + "': output does not match its input's size or dtype");
    out.data = permute ? ir::Bytes(permute_constant_data(in, ops::permutation_of(node, in.shape.size()))) : in.data;
    out.is_constant = true;
    out.producer = -1;
    node.op = "kiln.folded";
  }
}

}  // namespace kiln::passes
