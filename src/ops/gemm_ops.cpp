#include "ops/gemm_ops.h"

#include "ir/graph.h"

namespace kiln::ops {

bool is_gemm_op(const std::string& op) {
  return op == "aten.linear.default" || op == "aten.addmm.default" || op == "aten.mm.default" || op == "aten.bmm.default";
}

std::string check_gemm(const compiler::OpQuery& q) {
  const auto& in = q.inputs;
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype) return "operands have different dtypes";
  if (q.op == "aten.mm.default") {
    if (in.size() != 2 || in[0].shape.size() != 2 || in[1].shape.size() != 2)
      return "mm needs two 2-D operands";
    return "";
  }
  if (q.op == "aten.bmm.default") {
    if (in.size() != 2 || in[0].shape.size() != 3 || in[1].shape.size() != 3)
      return "bmm needs two 3-D operands";
    if (in[0].shape[0] != in[1].shape[0] || in[0].shape[2] != in[1].shape[1])
      return "bmm operands " + ir::shape_to_string(in[0].shape) + " and " + ir::shape_to_string(in[1].shape) +
             " do not match";
    return "";
  }
  if (q.op == "aten.addmm.default") {
    if (in.size() != 3 || in[1].shape.size() != 2 || in[2].shape.size() != 2)
      return "addmm needs 2-D mat1 and mat2";
    int64_t m = in[1].shape[0], n = in[2].shape[1];
    const auto& s = in[0].shape;
    bool bias_row = (s.size() == 1 && s[0] == n) || (s.size() == 2 && s[0] == 1 && s[1] == n);
    bool full = s.size() == 2 && s[0] == m && s[1] == n;
    if (!bias_row && !full) return "addmm input of shape " + ir::shape_to_string(s) + " is not [n], [1, n] or [m, n]";
    return "";
  }
  if (q.op == "aten.linear.default") {
    if (in.size() < 2 || in.size() > 3) return "linear needs input, weight and an optional bias";
    if (in[0].shape.empty()) return "linear input must have at least one dimension";
    if (in[1].shape.size() != 2) return "linear weight must be 2-D";
    if (in.size() == 3 && in[2].shape.size() != 1) return "linear bias must be 1-D";
    return "";
  }
  return "not a matrix product";
}

}  // namespace kiln::ops
