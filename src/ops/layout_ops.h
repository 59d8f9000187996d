// Ops that move elements without arithmetic: permute/transpose of
// activations, slice, select, cat, split, repeat, as_strided, and the
// functionalized in-place writes copy (src broadcast to self's shape) and
// slice_scatter (self with a step-1 slice replaced by src). Each becomes
// one or more layout kernels (an affine read and an affine write, see
// passes/exec_plan.h), or aliases its input where it keeps the element order
// (a permute that moves only size-1 dims, an as_strided with the input's own
// strides). A kernel reads through the views, permutes, slices and selects
// before it whose results nothing else reads, so a chain of them is one
// kernel (or an alias). Of constants they are evaluated at export.
#pragma once

#include <string>
#include <vector>

#include "ops/op_query.h"
#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::ops {

bool is_layout_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_layout(const OpQuery& query);

// The layout kernels computing `node` (cat and split give one per piece).
std::vector<PointwisePlan> plan_layout(const ir::Graph& graph, const ir::Node& node);

class PlanContext;

// Where a fused elementwise kernel can read `value` from without the layout
// kernel that computes it: when `value` is the result of a chain of slices,
// selects, permutes and views whose intermediates nothing else reads, the
// chain's source storage and the map from `value`'s index to its element
// there. False when `value` is no such result. `all_readers`: the caller reads `value` in place for
// all of its readers (nodes it absorbs), so `value` itself may have several.
bool strided_source(PlanContext& ctx, int value, int* storage, AffineMap* map, bool all_readers = false);

// The bytes of `node`'s output when its input is the constant `in`,
// computed through its layout plan (one piece; repeat, as_strided).
std::vector<uint8_t> evaluate_layout(const ir::Graph& graph, const ir::Node& node, const ir::Value& in);

}  // namespace kiln::ops
