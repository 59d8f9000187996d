// Generates the gather kernel of a GatherPlan. The trailing dims that are
// copied whole (embedding's row, index_select's dims after `dim`) form a
// contiguous block moved in 16-byte vectors where its size allows (8 or 4
// bytes otherwise) and both base pointers are aligned, else element by
// element; each thread computes the block's source offset from the output
// coordinates and the index values (wrapped once if negative, then clamped
// into the data, see gather_ops.h). Shapes are baked in as constants.
#pragma once

#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "ops/gather_ops.h"

namespace kiln::ops {

constexpr unsigned kGatherBlock = 256;

struct GatherLaunch {
  uint32_t grid = 1;
};

// Statements bringing index `var` (a long long) into [0, size): a negative
// index wraps once, anything still outside is clamped (gather_ops.h). Shared
// by every kernel that indexes with a tensor's values (gathers, state scatter).
std::string wrap_clamp_index(const std::string& var, int64_t size, const std::string& indent);

// Kernel `name` with parameters (out, data, indices..., long long n_out).
std::string generate_gather_kernel(const ir::Graph& graph, const GatherPlan& plan, const std::string& name,
                                   GatherLaunch* launch);

}  // namespace kiln::ops
