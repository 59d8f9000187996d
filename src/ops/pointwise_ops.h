// The elementwise ATen ops the compiler fuses into generated kernels, each
// with the CUDA expression it becomes (pointwise_ops.cpp registers them in
// the op registry as OpRole::kElementwise; elementwise_kernel.cpp generates
// the kernels).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ops {

// Why the compiler refuses this node's attributes (e.g. div with a rounding
// mode), or an empty string when it takes them.
std::string check_pointwise_attrs(const std::string& op, const std::map<std::string, ir::Attr>& attrs);

// The float expression computing `node` from its operand expressions
// (`operands` are CUDA float expressions, one per tensor input).
std::string pointwise_expression(const ir::Node& node, const std::vector<std::string>& operands);

}  // namespace kiln::ops
