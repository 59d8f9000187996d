#include "ops/op_registry.h"

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>

namespace kiln::ops {
namespace {

// Function-local so registrations from other files' static initializers
// find it constructed whatever the initialization order.
std::map<std::string, std::unique_ptr<OpDef>>& registry() {
  static std::map<std::string, std::unique_ptr<OpDef>> ops;
  return ops;
}

}  // namespace

void register_op(OpDef def) {
  std::string name = def.name;
  if (def.role == OpRole::kElementwise && !def.expression)
    throw std::logic_error("kiln op registry: elementwise op " + name + " has no expression");
  if (def.role == OpRole::kStep && !def.plan)
    throw std::logic_error("kiln op registry: op " + name + " has no plan function");
  auto [it, fresh] = registry().emplace(name, std::make_unique<OpDef>(std::move(def)));
  if (!fresh) throw std::logic_error("kiln op registry: " + name + " registered twice");
}

const OpDef* find_op(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

std::vector<const OpDef*> all_ops() {
  std::vector<const OpDef*> ops;
  for (const auto& [name, def] : registry()) ops.push_back(def.get());
  return ops;
}

bool all_elementwise(const ir::Graph& graph, const std::vector<int>& nodes) {
  for (int n : nodes) {
    const OpDef* def = find_op(graph.nodes()[static_cast<size_t>(n)].op);
    if (def == nullptr || def->role != OpRole::kElementwise) return false;
  }
  return true;
}

std::string elementwise_expression(const ir::Node& node, const std::vector<std::string>& operands) {
  const OpDef* def = find_op(node.op);
  if (!def || def->role != OpRole::kElementwise)
    throw CompileError("node '" + node.name + "': " + node.op + " is not an elementwise op");
  return def->expression(node, operands);
}

const char* conv_gemm_name(OpOptions::ConvGemm mode) {
  switch (mode) {
    case OpOptions::ConvGemm::kUnstrided: return "unstrided";
    case OpOptions::ConvGemm::kNone: return "none";
    default: return "all";
  }
}

OpOptions::ConvGemm parse_conv_gemm(const std::string& name) {
  if (name == "all") return OpOptions::ConvGemm::kAll;
  if (name == "unstrided") return OpOptions::ConvGemm::kUnstrided;
  if (name == "none") return OpOptions::ConvGemm::kNone;
  throw CompileError("conv_gemm must be 'all', 'unstrided' or 'none', got '" + name + "'");
}

engine::KernelArg LowerContext::tensor_arg(int value) const {
  engine::KernelArg arg;
  arg.kind = engine::KernelArgKind::kTensor;
  arg.tensor = tensor(value);
  return arg;
}

engine::KernelArg LowerContext::int_arg(int64_t v) {
  engine::KernelArg arg;
  arg.kind = engine::KernelArgKind::kInt64;
  arg.i64 = v;
  return arg;
}

int PlanContext::sole_consumer(int value) const {
  const std::vector<int>& users = consumers(value);
  if (users.size() != 1 || is_output(value) || absorbed(users[0])) return -1;
  return users[0];
}

}  // namespace kiln::ops
