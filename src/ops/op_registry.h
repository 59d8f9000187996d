// The op registry: one OpDef per op name, registered by the file that
// implements the op (its capability check, its role in fusion, its
// elementwise expression or its planning; the plan lowers itself, see
// step_plan.h). The capability query (compiler/op_support.cpp), the Python
// partitioner (through supported_ops/check_support), the passes and the
// lowering all find ops here, so there is no second list to drift.
//
// Registration: each op file defines `KILN_REGISTER_OPS(family) { ... }`;
// the kiln_ops library is linked whole-archive (src/ops/CMakeLists.txt) so
// these static registrations are never dropped by the linker.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

enum class OpRole {
  kElementwise,  // joins generated elementwise kernels: needs `expression`
  kView,         // reinterprets its input's storage: no launch
  kStep,         // plans its own step(s): needs `plan`
  kRewritten,    // replaced by an earlier pass (e.g. batch norm folding,
                 // channels-last conv); never reaches fusion
};

using CheckFn = std::function<std::string(const OpQuery&)>;  // "" when taken, else why not
using ExpressionFn = std::function<std::string(const ir::Node&, const std::vector<std::string>&)>;
using PlanFn = std::function<void(PlanContext&, int node)>;

// The values an index input may hold: [lo, hi) over the dim it indexes, as PyTorch takes them
// (it raises outside; Kiln's kernels clamp, so a bad index would be a silent wrong answer). The
// compiler records them for graph inputs read as indices (compiler/input_bounds.cpp) and the
// runtime refuses bad host values before any launch (engine_format/input_bounds.h).
struct IndexRange {
  int input = 0;  // the node's input number
  int64_t lo = 0, hi = 0;
  std::string what;  // what the index picks, e.g. "dim 2 (size 768) of state 'k_cache_0'"
};
using IndexRangeFn = std::function<std::vector<IndexRange>(const ir::Graph&, const ir::Node&)>;

struct OpDef {
  std::string name;  // edge-dialect name, e.g. "aten.addmm.default"; "kiln.*" are internal
  OpRole role = OpRole::kStep;
  // Op-specific capability check, after the generic one (float tensors of
  // static shape, see compiler/op_support.cpp). May be empty.
  CheckFn check;
  // kElementwise: the number of tensor inputs and the CUDA float expression
  // of the node from its operand expressions.
  int tensor_inputs = 1;
  ExpressionFn expression;
  // kStep: plans the node (and whatever later nodes it absorbs).
  PlanFn plan;
  // Multi-output ops of which Kiln computes output 0 only: why it cannot
  // take the node when a later output is used (the partitioner checks).
  std::string first_output_only;
  // A constant input of a non-float dtype is accepted (folded at export).
  bool folds_constant_inputs = false;
  // kStep ops whose tensor inputs may be bool (attention masks); elementwise
  // ops and views always may.
  bool bool_inputs = false;
  // Dtypes beyond the float ones (compiler/op_support.cpp): the op moves or
  // selects elements whatever their dtype, so its inputs and outputs may
  // also be int64, int32 or bool (views, layout copies, gathers' data).
  // Elementwise ops take integer operands anyway (see elementwise_kernel.h).
  bool any_dtype = false;
  // Inputs (tensor input numbers) that must be int64 or int32 indices
  // (embedding's and gather's indices).
  std::vector<int> index_inputs;
  // The range of each index input (see IndexRange); empty: none recorded.
  IndexRangeFn index_ranges;

  bool internal() const { return name.rfind("kiln.", 0) == 0; }
};

// nullptr when no op of that name is registered.
const OpDef* find_op(const std::string& name);

// Whether every node in `nodes` is an elementwise op of the registry (each
// is then computed inside some fused elementwise kernel).
bool all_elementwise(const ir::Graph& graph, const std::vector<int>& nodes);
// Every registered op, sorted by name.
std::vector<const OpDef*> all_ops();
// Registers `def`; throws std::logic_error on a duplicate name (a bug).
void register_op(OpDef def);

// The elementwise expression of `node` (its op must be kElementwise);
// throws CompileError otherwise.
std::string elementwise_expression(const ir::Node& node, const std::vector<std::string>& operands);

struct OpRegistrar {
  explicit OpRegistrar(void (*fn)()) { fn(); }
};

}  // namespace kiln::ops

#define KILN_REGISTER_OPS(family)                                          \
  static void kiln_register_ops_##family();                                \
  static const ::kiln::ops::OpRegistrar kiln_ops_registrar_##family{       \
      &kiln_register_ops_##family};                                        \
  static void kiln_register_ops_##family()
