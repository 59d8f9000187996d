// The capability query: the generic checks (float tensors of static shape)
// plus the op's own check from the registry. The Python partitioner asks it
// node by node (check_support), so what it accepts must compile.
#include <algorithm>

#include "compiler/compiler.h"
#include "ops/op_registry.h"

namespace kiln::compiler {
namespace {

bool is_float(engine::DType d) {
  return d == engine::DType::kFloat32 || d == engine::DType::kFloat16 || d == engine::DType::kBFloat16;
}

// Elementwise ops and views also take bool tensors (masks, comparisons).
std::optional<std::string> check_tensors(const OpQuery& q, bool allow_bool) {
  auto check = [allow_bool](const TensorInfo& t, const char* what, size_t i) -> std::optional<std::string> {
    if (!is_float(t.dtype) && !(allow_bool && t.dtype == engine::DType::kBool))
      return std::string(what) + " " + std::to_string(i) + " is " + engine::dtype_name(t.dtype) +
             "; Kiln engines take float32, float16 and bfloat16 tensors" + (allow_bool ? " (and bool masks)" : "");
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
  const bool allow_bool =
      def->role == ops::OpRole::kElementwise || def->role == ops::OpRole::kView || def->bool_inputs;
  if (auto r = check_tensors(checked, allow_bool)) return r;
  if (def->check) {
    std::string why = def->check(q);
    if (!why.empty()) return why;
  }
  return std::nullopt;
}

}  // namespace kiln::compiler
