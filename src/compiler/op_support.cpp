// The capability query: the one place that decides which nodes Kiln takes.
// The Python partitioner asks it node by node (check_support), so what it
// accepts here must compile in compiler.cpp.
#include <algorithm>

#include "compiler/compiler.h"
#include "ops/conv_ops.h"
#include "ops/gemm_ops.h"
#include "ops/pool_ops.h"
#include "ops/layout_ops.h"
#include "ops/reduce_ops.h"
#include "ops/pointwise_ops.h"
#include "ops/view_ops.h"

namespace kiln::compiler {
namespace {

bool is_float(engine::DType d) {
  return d == engine::DType::kFloat32 || d == engine::DType::kFloat16 || d == engine::DType::kBFloat16;
}

std::optional<std::string> check_tensors(const OpQuery& q) {
  auto check = [](const TensorInfo& t, const char* what, size_t i) -> std::optional<std::string> {
    if (!is_float(t.dtype))
      return std::string(what) + " " + std::to_string(i) + " is " + engine::dtype_name(t.dtype) +
             "; Kiln engines take float32, float16 and bfloat16 tensors";
    if (t.shape.size() > engine::kMaxRank) return std::string(what) + " has rank over 8";
    for (int64_t d : t.shape)
      if (d < 0) return std::string(what) + " " + std::to_string(i) + " has a dynamic dimension (not supported yet)";
    return std::nullopt;
  };
  for (size_t i = 0; i < q.inputs.size(); ++i)
    if (auto r = check(q.inputs[i], "input", i)) return r;
  if (q.outputs.empty()) return "op has no tensor output";
  for (size_t i = 0; i < q.outputs.size(); ++i)
    if (auto r = check(q.outputs[i], "output", i)) return r;
  return std::nullopt;
}

}  // namespace

std::vector<std::string> supported_ops() {
  std::vector<std::string> names = {"aten.linear.default", "aten.addmm.default", "aten.mm.default",
                                    "aten.bmm.default", "aten.convolution.default", ops::kBatchNorm,
                                    "aten.max_pool2d_with_indices.default", "aten.max_pool2d.default",
                                    "aten.avg_pool2d.default", "aten._adaptive_avg_pool2d.default"};
  for (const auto& p : ops::pointwise_ops())
    if (std::string(p.name).rfind("aten.", 0) == 0) names.push_back(p.name);
  for (const char* v : {"aten.view_copy.default", "aten._unsafe_view.default", "aten.squeeze_copy.dims",
                        "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default", "aten.alias_copy.default",
                        "aten.permute_copy.default", "aten.t_copy.default", "aten.transpose_copy.int",
                        "aten.slice_copy.Tensor", "aten.select_copy.int", "aten.cat.default",
                        "aten.split_with_sizes_copy.default", "aten.split_copy.Tensor", "aten.sum.dim_IntList",
                        "aten.mean.dim", "aten.amax.default"})
    names.push_back(v);
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<std::string> check_support(const OpQuery& q) {
  bool known = ops::is_gemm_op(q.op) || ops::find_pointwise_op(q.op) || ops::is_view_op(q.op) ||
               ops::is_layout_op(q.op) || ops::is_reduce_op(q.op) || ops::is_conv_op(q.op) ||
               ops::is_batch_norm_op(q.op) || ops::is_pool_op(q.op);
  if (!known) return q.op + " is not implemented by the Kiln compiler";
  if (ops::is_batch_norm_op(q.op) || q.op == "aten.max_pool2d_with_indices.default") {
    // Several outputs, of which Kiln computes the first (batch norm's saved
    // statistics are empty in inference; max_pool2d's indices must be unused,
    // which the partitioner checks).
    if (q.outputs.empty()) return q.op + " has no outputs";
    OpQuery first = q;
    first.outputs.resize(1);
    if (auto r = check_tensors(first)) return r;
    std::string why = ops::is_batch_norm_op(q.op) ? ops::check_batch_norm(q) : ops::check_pool(q);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  // Casting a constant (e.g. an integer scalar lifted by export) to a float
  // dtype is folded at export.
  bool constant_cast = q.op == "aten._to_copy.default" && q.inputs.size() == 1 && q.inputs[0].is_constant &&
                       q.outputs.size() == 1 && is_float(q.outputs[0].dtype);
  if (constant_cast) return std::nullopt;
  if (auto r = check_tensors(q)) return r;
  if (ops::is_layout_op(q.op)) {
    std::string why = ops::check_layout(q);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  if (q.outputs.size() != 1) return "ops with several outputs are not supported yet";
  if (ops::is_reduce_op(q.op)) {
    std::string why = ops::check_reduce(q);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  if (ops::is_conv_op(q.op)) {
    std::string why = ops::check_conv(q);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  if (ops::is_pool_op(q.op)) {
    std::string why = ops::check_pool(q);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  if (ops::is_gemm_op(q.op)) {
    std::string why = ops::check_gemm(q);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  if (const ops::PointwiseOp* p = ops::find_pointwise_op(q.op)) {
    if (static_cast<int>(q.inputs.size()) != p->tensor_inputs)
      return q.op + " with " + std::to_string(q.inputs.size()) + " tensor inputs is not supported";
    std::string why = ops::check_pointwise_attrs(q.op, q.attrs);
    if (!why.empty()) return why;
    return std::nullopt;
  }
  if (q.inputs.size() != 1) return q.op + " needs exactly one tensor input";  // views
  if (ops::is_view_op(q.op) && q.inputs[0].dtype != q.outputs[0].dtype) return "view changes dtype";
  return std::nullopt;
}

}  // namespace kiln::compiler
