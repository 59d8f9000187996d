// The capability query: the generic checks (float tensors of static shape)
// plus the op's own check from the registry. The Python partitioner asks it
// node by node (check_support), so what it accepts must compile.
#include <algorithm>

#include "codegen/cuda_dtype.h"
#include "compiler/compiler.h"
#include "ops/elementwise_kernel.h"
#include "ops/op_registry.h"
#include "passes/passes.h"

namespace kiln::compiler {
using codegen::is_float;
namespace {

// Which dtypes a tensor of the node may have: float always; bool and
// int64/int32 too for views and ops that declare any_dtype; for elementwise
// ops bool anywhere and integer operands (integer results only where the
// elementwise kernel computes them exactly); index inputs must be
// int64/int32.
struct DtypeRule {
  bool allow_bool = false;
  bool allow_integer_inputs = false;
  bool allow_integer_outputs = false;
  const std::vector<int>* index_inputs = nullptr;
};

std::optional<std::string> check_tensors(const OpQuery& q, const DtypeRule& rule) {
  auto shape_ok = [](const TensorInfo& t, const std::string& what) -> std::optional<std::string> {
    if (t.shape.size() > engine::kMaxRank) return what + " has rank over 8";
    for (int64_t d : t.shape)
      if (d < 0) return what + " has a dynamic dimension (not supported yet)";
    return std::nullopt;
  };
  auto dtype_ok = [&](const TensorInfo& t, bool integer_ok, const std::string& what) -> std::optional<std::string> {
    if (is_float(t.dtype) || (rule.allow_bool && t.dtype == engine::DType::kBool) ||
        (integer_ok && codegen::is_integer(t.dtype)))
      return std::nullopt;
    return what + " is " + engine::dtype_name(t.dtype) + "; " + q.op + " takes float32, float16 and bfloat16" +
           (rule.allow_bool ? ", bool" : "") + (integer_ok ? ", int64 and int32" : "") + " tensors there";
  };
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    const std::string what = "input " + std::to_string(i);
    const bool index = rule.index_inputs &&
                       std::find(rule.index_inputs->begin(), rule.index_inputs->end(), static_cast<int>(i)) !=
                           rule.index_inputs->end();
    if (index && !codegen::is_integer(q.inputs[i].dtype))
      return what + " (indices) is " + engine::dtype_name(q.inputs[i].dtype) + "; " + q.op +
             " takes int64 or int32 indices";
    if (!index)
      if (auto r = dtype_ok(q.inputs[i], rule.allow_integer_inputs, what)) return r;
    if (auto r = shape_ok(q.inputs[i], what)) return r;
  }
  if (q.outputs.empty()) return "op has no tensor output";
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    const std::string what = "output " + std::to_string(i);
    if (auto r = dtype_ok(q.outputs[i], rule.allow_integer_outputs, what)) return r;
    if (auto r = shape_ok(q.outputs[i], what)) return r;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> supported_ops() {
  std::vector<std::string> names;
  for (const ops::OpDef* def : ops::all_ops())
    if (!def->internal()) names.push_back(def->name);
  return names;  // all_ops() is sorted by name
}

std::map<std::string, std::string> first_output_only_ops() {
  std::map<std::string, std::string> ops;
  for (const ops::OpDef* def : ops::all_ops())
    if (!def->internal() && !def->first_output_only.empty()) ops[def->name] = def->first_output_only;
  return ops;
}

std::vector<std::string> constant_view_ops() {
  std::vector<std::string> names;
  for (const ops::OpDef* def : ops::all_ops())
    if (!def->internal() && passes::folds_view_of_constant(def->name)) names.push_back(def->name);
  return names;
}

std::optional<std::string> check_support(const OpQuery& q) {
  const ops::OpDef* def = ops::find_op(q.op);
  if (def == nullptr || def->internal()) return q.op + " is not implemented by the Kiln compiler";
  if (q.outputs.empty()) return q.op + " has no outputs";
  OpQuery checked = q;
  // Multi-output ops of which Kiln computes the first (the partitioner
  // refuses nodes whose later outputs are used: first_output_only says why).
  if (!def->first_output_only.empty()) checked.outputs.resize(1);
  bool constant_cast = def->folds_constant_inputs && q.inputs.size() == 1 && q.inputs[0].is_constant &&
                       checked.outputs.size() == 1 && is_float(checked.outputs[0].dtype);
  if (constant_cast) return std::nullopt;
  DtypeRule rule;
  const bool elementwise = def->role == ops::OpRole::kElementwise;
  const bool any = def->any_dtype || def->role == ops::OpRole::kView;  // views alias whatever they are given
  rule.allow_bool = any || elementwise || def->bool_inputs;  // bool_inputs: attention masks
  rule.allow_integer_inputs = any || elementwise;
  rule.allow_integer_outputs = any || (elementwise && ops::integer_elementwise_supported(q.op));
  rule.index_inputs = &def->index_inputs;
  if (auto r = check_tensors(checked, rule)) return r;
  if (def->check) {
    std::string why = def->check(q);
    if (!why.empty()) return why;
  }
  return std::nullopt;
}

}  // namespace kiln::compiler
