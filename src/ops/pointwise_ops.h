// The elementwise ATen ops the compiler fuses into generated kernels, each
// with the CUDA expression it becomes. One table, read by the capability query
// (op_support.cpp) and by the kernel generator (codegen/pointwise_codegen.cpp),
// so the two cannot disagree.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ops {

struct PointwiseOp {
  const char* name;    // edge-dialect op name, e.g. "aten.add.Tensor"
  int tensor_inputs;   // 1 or 2
};

// nullptr when `op` is not an elementwise op the compiler knows.
const PointwiseOp* find_pointwise_op(const std::string& op);

const std::vector<PointwiseOp>& pointwise_ops();

// Why the compiler refuses this node's attributes (e.g. div with a rounding
// mode), or an empty string when it takes them.
std::string check_pointwise_attrs(const std::string& op, const std::map<std::string, ir::Attr>& attrs);

// The float expression computing `node` from its operand expressions
// (`operands` are CUDA float expressions, one per tensor input).
std::string pointwise_expression(const ir::Node& node, const std::vector<std::string>& operands);

}  // namespace kiln::ops
