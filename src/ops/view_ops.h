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

// A tensor's layout inside some storage where a dim may be made of several
// strided factors (outer first). A view that merges dims whose strides do
// not line up (the [S, B*H, D] of nn.MultiheadAttention at batch > 1, heads
// cut out of a [S, B, 3E] projection) has no single stride per dim, but the
// factors survive until a later view splits them apart again.
struct StrideFactor {
  int64_t size = 1, stride = 0;
};
using FactoredDims = std::vector<std::vector<StrideFactor>>;

// One factor per dim (size-1 dims get none).
FactoredDims factored_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);
// The dims `dims` hold as a view of shape `new_shape`: their factors, outer
// to inner, regrouped (and split where a new dim cuts one) into the new
// dims; nullopt when a new dim would cut a factor unevenly.
std::optional<FactoredDims> view_factored(const FactoredDims& dims, const std::vector<int64_t>& new_shape);
// Sizes of the dims.
std::vector<int64_t> factored_shape(const FactoredDims& dims);
// One stride per dim when every dim's factors merge into one (each factor's
// stride is the next one's size times stride; 0 for a size-1 dim); nullopt
// otherwise.
std::optional<std::vector<int64_t>> plain_strides(const FactoredDims& dims);

}  // namespace kiln::ops
