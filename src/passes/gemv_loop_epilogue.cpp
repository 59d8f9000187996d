// After group_launches: a matrix-vector kernel over one row whose output only
// the next step reads, that step being grid loops (a launch group, or one
// loop) each iteration of which reads one column of the product (and a
// rotary's partner half a head away), runs those loops in its own epilogue
// (GemmPlan::loop_members, gemv_kernel.h). A decode layer's q|k|v product
// then writes q's rotary and the k and v cache rows itself: the launch group
// between it and the attention is gone.
#include <optional>

#include "ops/grid_loop.h"
#include "ops/rotary_ops.h"
#include "ops/state_ops.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// What a member reads of the product: iteration i reads column offset + i,
// for `count` iterations; rotary_dim is the rotary's last dim (0: none),
// whose iteration also reads the column half of it away.
struct MemberRead {
  int64_t offset = 0, count = 0, rotary_dim = 0;
};

// Whether `map` walks a row-major `shape` contiguously from its base.
bool contiguous(const AffineMap& map, const std::vector<int64_t>& shape) {
  if (map.coef.size() != shape.size()) return false;
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && map.coef[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

// How `op` reads the product's storage, when it is a member this pass knows
// (a rotary, a cache update with or without its rotary) and reads it so.
std::optional<MemberRead> member_read(const ir::Graph& graph, const ExecPlan& plan, const ops::PlannedOp& op,
                                      int storage) {
  if (const auto* r = op.as<ops::RotaryPlan>()) {
    const std::vector<int64_t>& shape = graph.value(r->out).shape;
    if (r->x_storage < 0 || plan.storage_of(r->x_storage) != storage || !contiguous(r->x_map, shape))
      return std::nullopt;
    return MemberRead{r->x_map.base, ir::numel_of(shape), shape.back()};
  }
  if (const auto* u = op.as<ops::StateScatterPlan>()) {
    const std::vector<int64_t>& shape = graph.value(u->values).shape;
    if (u->values_storage < 0 || plan.storage_of(u->values_storage) != storage || !contiguous(u->values_map, shape))
      return std::nullopt;
    return MemberRead{u->values_map.base, ir::numel_of(shape), u->rotary_cos >= 0 ? shape.back() : 0};
  }
  return std::nullopt;
}

}  // namespace

int plan_gemv_loop_epilogues(const ir::Graph& graph, ExecPlan& plan) {
  const std::vector<bool> is_output = kept_storage(graph, plan);
  std::vector<bool> remove(plan.ops.size(), false);
  int fused = 0;
  for (size_t i = 0; i + 1 < plan.ops.size(); ++i) {
    ops::GemmPlan* g = plan.ops[i].as<ops::GemmPlan>();
    if (g == nullptr || !g->gemv || g->paired || !g->loop_members.empty() || g->m != 1 || g->batch != 1 ||
        g->c >= 0 || (g->epilogue != engine::GemmEpilogue::kNone && g->epilogue != engine::GemmEpilogue::kBias))
      continue;
    const int storage = plan.storage_of(g->out);
    if (is_output[static_cast<size_t>(storage)]) continue;
    // Only the next step reads the product.
    if (sole_step_reader(plan, i, storage, remove) != static_cast<int>(i + 1)) continue;
    ops::PlannedOp& next = plan.ops[i + 1];
    std::vector<ops::PlannedOp> members;
    if (const auto* group = next.as<ops::LaunchGroupPlan>())
      members = group->members;
    else if (ops::is_grid_loop(next))
      members.push_back(next);
    else
      continue;
    std::vector<MemberRead> member_reads;
    int64_t rotary_dim = 0;
    bool ok = true;
    for (const ops::PlannedOp& m : members) {
      const std::optional<MemberRead> r = member_read(graph, plan, m, storage);
      ok = ok && r.has_value() && (r->rotary_dim == 0 || rotary_dim == 0 || r->rotary_dim == rotary_dim);
      if (!ok) break;
      if (r->rotary_dim > 0) rotary_dim = r->rotary_dim;
      member_reads.push_back(*r);
    }
    if (!ok) continue;
    // A warp's two columns: a rotary's pair (j, j + dim / 2) of one head, or the two halves of the row.
    const int64_t half = rotary_dim > 0 ? rotary_dim / 2 : g->n / 2;
    if (half < 1 || rotary_dim % 2 != 0 || g->n % (2 * half) != 0) continue;
    for (const MemberRead& r : member_reads)
      ok = ok && r.offset % (2 * half) == 0 && r.count % (2 * half) == 0 && r.offset >= 0 && r.offset + r.count <= g->n;
    if (!ok) continue;
    g->loop_members = std::move(members);
    for (const MemberRead& r : member_reads) g->loop_offsets.push_back(r.offset);
    g->loop_half = half;
    plan.ops[i].label += "+" + next.label;
    remove[i + 1] = true;
    ++fused;
    ++i;  // the next step is gone
  }
  erase_steps(plan, remove);
  return fused;
}

}  // namespace kiln::passes
