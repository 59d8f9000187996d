// Constant folding: weight transposes and views of constants are done once at
// export, so the engine reads weights in the layout the GEMM wants.
#include <cstring>

#include "ops/view_ops.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

std::vector<int64_t> permutation_of(const ir::Node& node, size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
  auto norm = [&](int64_t d) {
    int64_t r = static_cast<int64_t>(rank);
    if (d < -r || d >= r) throw CompileError("node '" + node.name + "': dimension " + std::to_string(d) + " out of range");
    return d < 0 ? d + r : d;
  };
  if (node.op == "aten.permute_copy.default" || node.op == "aten.permute.default") {
    std::vector<int64_t> dims = node.ints_attr("dims");
    if (dims.size() != rank) throw CompileError("node '" + node.name + "': permute dims do not match the rank");
    for (size_t i = 0; i < rank; ++i) perm[i] = norm(dims[i]);
  } else if (node.op == "aten.t_copy.default" || node.op == "aten.t.default") {
    if (rank == 2) std::swap(perm[0], perm[1]);
  } else {  // transpose_copy.int
    int64_t a = norm(node.int_attr("dim0", 0)), b = norm(node.int_attr("dim1", 1));
    std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
  }
  return perm;
}

// out[i_0..i_r] = in[i_perm^-1...]: output dim j is input dim perm[j].
std::vector<uint8_t> permute_data(const ir::Value& in, const std::vector<int64_t>& perm) {
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

}  // namespace

void fold_constants(ir::Graph& graph) {
  for (ir::Node& node : graph.nodes()) {
    if (node.inputs.size() != 1 || node.outputs.size() != 1) continue;
    bool permute = ops::is_constant_permute_op(node.op);
    if (!permute && !ops::is_view_op(node.op)) continue;
    const ir::Value& in = graph.value(node.inputs[0]);
    if (!in.is_constant) continue;
    ir::Value& out = graph.value(node.outputs[0]);
    if (out.numel() != in.numel() || out.dtype != in.dtype)
      throw CompileError("node '" + node.name + "': output does not match its input's size or dtype");
    out.data = permute ? permute_data(in, permutation_of(node, in.shape.size())) : in.data;
    out.is_constant = true;
    out.producer = -1;
    node.op = "kiln.folded";
  }
}

}  // namespace kiln::passes
