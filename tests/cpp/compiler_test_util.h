// Graph builders and engine queries shared by the compiler tests.
#pragma once

#include <random>

#include "engine_format/engine_desc.h"
#include "ir/graph.h"

namespace kiln::testing {

std::vector<uint8_t> random_float_bytes(size_t count, std::mt19937& rng);

// x[batch, in] -> Linear(in, hidden) -> GELU -> Linear(hidden, hidden) -> ReLU
// -> Linear(hidden, out), in the edge dialect's decomposed form
// (permute_copy of the weight + addmm).
ir::Graph make_mlp_graph(int64_t batch, int64_t in, int64_t hidden, int64_t out, std::mt19937& rng);

// Steps of an engine of one kind, or with one label.
size_t count_kind(const engine::EngineDesc& d, engine::StepKind kind);
size_t count_label(const engine::EngineDesc& d, const std::string& label);

}  // namespace kiln::testing
