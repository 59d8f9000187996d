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

}  // namespace kiln::passes
