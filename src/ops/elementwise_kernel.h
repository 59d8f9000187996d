// The generated elementwise kernel (PointwisePlan): the CUDA source of one
// fused elementwise or layout kernel. Shapes are baked
// in as constants, so broadcast indexing divides by compile-time numbers.
// Loads convert any float dtype to float, math runs in float, the store
// converts to the output dtype.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

constexpr unsigned kPointwiseBlock = 256;

// Helpers every generated module starts with (dtype conversion, activations).
std::string pointwise_prelude();

// Whether `op` may have an int64/int32 result inside an elementwise kernel
// (integer arithmetic, bitwise ops, selection, casts and copies); others
// with integer operands must have a float or bool result.
bool integer_elementwise_supported(const std::string& op);

// A float scalar as a CUDA literal that round-trips (inf and NaN as bits).
std::string elementwise_scalar(double v);

// The CUDA expression of elementwise `node` in the types its values have in
// a kernel (codegen::value_type): an integer result is computed exactly in
// its integer type, a comparison of integers exactly, anything else in float
// (integer operands converted, as torch promotes). `types`: the operands'
// dtypes. Throws CompileError for an op with an unsupported integer result.
std::string typed_expression(const ir::Node& node, std::vector<std::string> operands,
                             const std::vector<engine::DType>& types, engine::DType out);

// Writes one `const <type> <t><k><suffix> = <expr>;` line per node of an
// elementwise chain (graph order), reading operands from `name_of` (value id
// -> CUDA expression) and adding each result to it. Returns the last
// variable, or "" for an empty chain. `where` names the kernel in errors.
std::string emit_elementwise_chain(const ir::Graph& graph, const std::vector<int>& nodes,
                                   std::map<int, std::string>& name_of, const std::string& suffix,
                                   const std::string& indent, const std::string& where, std::ostream& out);

// Offset into an input of shape `in` broadcast to `out` (right-aligned), for
// flat output index `i` (a CUDA expression); throws CompileError when `in`
// does not broadcast to `out`.
std::string broadcast_offset(const std::vector<int64_t>& in, const std::vector<int64_t>& out);

// Kernel `name` with parameters (out, inputs..., long long n), in that order.
std::string generate_pointwise_kernel(const ir::Graph& graph, const PointwisePlan& plan,
                                      const std::string& name);

}  // namespace kiln::ops
