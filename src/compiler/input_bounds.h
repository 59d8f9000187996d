// Which graph inputs ops read as indices, and the values each may hold (ops::IndexRange), for
// the engine's metadata (engine_format/input_bounds.h): the runtime then refuses a bad host
// index (a token id past the vocabulary, a position past the KV cache) with a message instead
// of a kernel clamping it into a wrong answer.
#pragma once

#include <string>
#include <vector>

#include "engine_format/input_bounds.h"
#include "ir/graph.h"

namespace kiln::compiler {

// Every use of an input as an index, traced back through ops that pass values unchanged (views,
// permutes, identity copies, widening integer casts), intersected per input. Input numbers are
// positions in graph.inputs(), which are the engine's inputs in order.
std::vector<engine::InputBound> input_index_bounds(const ir::Graph& graph);

// Narrows `b` to [lo, hi) as well (an empty range leaves lo >= hi); the message names the
// tighter side's `what`.
void intersect_bound(engine::InputBound& b, int64_t lo, int64_t hi, const std::string& what);

}  // namespace kiln::compiler
