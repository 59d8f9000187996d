// Splits column reductions that would run on too few blocks (the spatial mean
// of a squeeze-excitation block over [8,112,112,32] is 8 blocks of 12,544
// rows each: 35 us on an H200) into two column reductions: partial results
// over equal chunks of the reduced rows into a float32 temporary, then the
// same reduction over the chunks. Equal chunks keep a mean exact (mean of
// means), and sum and amax combine as themselves.
#include <string>
#include <vector>

#include "ops/reduce_kernel.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr int64_t kTargetBlocks = 264;    // two per SM on an H100/H200
constexpr int64_t kMinRowsPerChunk = 64;  // below this a chunk is mostly launch and combine
constexpr int64_t kMinRowsToSplit = 1024;

const char* reduce_op_name(ReducePlan::Kind kind) {
  switch (kind) {
    case ReducePlan::Kind::kMean: return "aten.mean.dim";
    case ReducePlan::Kind::kMax: return "aten.amax.default";
    default: return "aten.sum.dim_IntList";
  }
}

// The number of chunks: the smallest divisor of `rows` that reaches the
// target block count with chunks of at least kMinRowsPerChunk rows, else the
// largest divisor that keeps chunks that long; 1 when none helps.
int64_t chunk_count(int64_t rows, int64_t blocks, int64_t outer) {
  int64_t best = 1;
  for (int64_t d = 2; rows / d >= kMinRowsPerChunk && outer * d <= 65535; ++d) {
    if (rows % d) continue;
    best = d;
    if (blocks * d >= kTargetBlocks) break;
  }
  return best;
}

}  // namespace

void split_reductions(ir::Graph& graph, ExecPlan& plan) {
  std::vector<PlannedOp> ops;
  ops.reserve(plan.ops.size());
  for (PlannedOp& op : plan.ops) {
    int64_t outer = 0, rows = 0, inner = 0;
    if (!op.is<ReducePlan>()) {
      ops.push_back(std::move(op));
      continue;
    }
    const ReducePlan r = *op.as<ReducePlan>();
    // Copies: add_node below may move the graph's values.
    const std::vector<int64_t> in_shape = graph.value(r.input).shape;
    const engine::DType in_dtype = graph.value(r.input).dtype;
    const std::string name = graph.value(r.out).name;
    const bool column = ops::reduce_column_shape(in_shape, r.dims, outer, rows, inner);
    const int64_t blocks = column ? ops::reduce_column_blocks(outer, inner) : 0;
    const int64_t chunks = column && blocks < kTargetBlocks && rows >= kMinRowsToSplit ? chunk_count(rows, blocks, outer) : 1;
    if (chunks == 1) {
      ops.push_back(std::move(op));
      continue;
    }
    // in viewed as [outer, chunks, rows/chunks, inner] (a view of the same storage).
    const std::vector<int64_t> chunked = {outer, chunks, rows / chunks, inner};
    int view_node = graph.add_node("aten.view.default", name + "_chunked", {r.input}, {{"size", chunked}},
                                   {{in_dtype, chunked}});
    const int view = graph.nodes()[static_cast<size_t>(view_node)].outputs[0];
    plan.alias_of[view] = plan.storage_of(r.input);
    int partial_node = graph.add_node(reduce_op_name(r.kind), name + "_partial", {view},
                                      {{"dim", std::vector<int64_t>{2}}},
                                      {{engine::DType::kFloat32, {outer, chunks, inner}}});
    const int partial = graph.nodes()[static_cast<size_t>(partial_node)].outputs[0];

    ReducePlan first = r, second = r;
    first.input = view;
    first.out = partial;
    first.dims = {2};
    second.input = partial;
    second.dims = {1};
    ops.emplace_back(op.label + "(" + std::to_string(chunks) + " chunks)", std::move(first));
    ops.emplace_back(op.label + "(of chunks)", std::move(second));
  }
  plan.ops = std::move(ops);
}

}  // namespace kiln::passes
