// Ops that only reinterpret a contiguous tensor (view, reshape, squeeze,
// unsqueeze) and ops that reorder constants (permute, t, transpose), which the
// compiler folds at export time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ops {

// Pure reinterpretations (OpRole::kView): the output aliases the input's storage.
bool is_view_op(const std::string& op);

// Dimension reorders: folded at export on constants, a gather kernel otherwise.
bool is_constant_permute_op(const std::string& op);

// A copy that changes nothing but the storage: clone, or a cast to the
// dtype it already has (fp16 attention decompositions are full of them).
bool is_identity_copy(const ir::Graph& graph, const ir::Node& node);

// For a permute/t/transpose node over a rank-`rank` input: output dim j is
// input dim perm[j]. Throws CompileError on out-of-range dims.
std::vector<int64_t> permutation_of(const ir::Node& node, size_t rank);

// The strides of a view of a tensor with `shape` and `strides` as
// `new_shape` without copying, when there are such strides (torch's view
// rule: each run of merged dims must be contiguous within itself).
std::optional<std::vector<int64_t>> view_strides(const std::vector<int64_t>& shape,
                                                 const std::vector<int64_t>& strides,
                                                 const std::vector<int64_t>& new_shape);

}  // namespace kiln::ops
