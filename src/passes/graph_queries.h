// Questions passes ask about who reads a value (compiler code).
#pragma once

#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

// A copy that only re-describes memory: a permute, expand, slice, select, or
// a clone/cast that changes nothing (what attention operands are read through).
bool is_layout_copy(const ir::Graph& graph, const ir::Node& node);

// The node reading v, when exactly one node reads it and v is no graph
// output; -1 otherwise. `consumers` is consumers_of(graph).
int sole_reader(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v);

// Whether every use of v, through views and layout copies, is an operand of
// an attention step, which reads it through strides (so the copies vanish).
bool only_attention_reads(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v);

// Whether every use of v can read it through strides, so a slice of it costs
// no copy: attention operands (as above), or, through views, permutes,
// slices and selects each read by one node, the x of a rotary, the values of
// a cache update or an operand of fused elementwise arithmetic, also of
// several elementwise ops at once (silu written as g * sigmoid(g))
// (ops/layout_ops.h strided_source).
bool only_strided_reads(const ir::Graph& graph, const std::vector<std::vector<int>>& consumers, int v);

}  // namespace kiln::passes
