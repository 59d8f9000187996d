// After fusion: a matrix-vector kernel whose result only one elementwise
// kernel reads, as the result's two last-dim halves (a merged gate|up read by
// SiLU(gate) * up, merge_linears.cpp), computes that kernel's arithmetic
// itself: each warp takes column j of both halves and stores the
// elementwise result (GemmPlan::paired, gemv_kernel.h). A decode
// step's MLP then is two kernels (gate|up with SiLU*up, down + residual).
#include <algorithm>

#include "ops/step_plan.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// Whether `map` reads, for element i of `out` (row-major), the product's
// element (i / half) * n + i % half + base: column i % half of row i / half.
bool reads_half(const AffineMap& map, const std::vector<int64_t>& out, int64_t n, int64_t half, int64_t base) {
  if (map.base != base || map.coef.size() != out.size() || out.empty() || out.back() != half) return false;
  int64_t stride = 1;
  for (size_t d = out.size(); d-- > 0;) {
    if (out[d] != 1) {
      const int64_t want = d + 1 == out.size() ? 1 : (stride / half) * n;
      if (map.coef[d] != want) return false;
    }
    stride *= out[d];
  }
  return true;
}

}  // namespace

void plan_gemv_pair_epilogues(const ir::Graph& graph, ExecPlan& plan) {
  const std::vector<bool> is_output = kept_storage(graph, plan);
  std::vector<bool> viewed(graph.values().size(), false);  // storage some view aliases
  for (const auto& [view, root] : plan.alias_of) viewed[static_cast<size_t>(root)] = true;
  std::vector<bool> remove(plan.ops.size(), false);
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    ops::GemmPlan* g = plan.ops[i].as<ops::GemmPlan>();
    if (g == nullptr || !g->gemv || g->paired || g->c >= 0 || g->batch != 1 || g->n % 2 != 0 ||
        (g->epilogue != engine::GemmEpilogue::kNone && g->epilogue != engine::GemmEpilogue::kBias))
      continue;
    const int storage = plan.storage_of(g->out);
    if (is_output[static_cast<size_t>(storage)] || viewed[static_cast<size_t>(storage)]) continue;
    // The one step reading the product.
    const int reader = sole_step_reader(plan, i, storage, remove);
    if (reader <= static_cast<int>(i)) continue;
    const ops::PointwisePlan* p = plan.ops[static_cast<size_t>(reader)].as<ops::PointwisePlan>();
    if (p == nullptr || p->nodes.empty() || !p->iter_shape.empty() || p->inputs.size() != 2 || p->strided.size() != 2)
      continue;
    const int64_t half = g->n / 2;
    const std::vector<int64_t>& out = graph.value(p->out).shape;
    if (ir::numel_of(out) != g->m * half) continue;
    const ops::PointwisePlan::StridedInput* first = nullptr;
    const ops::PointwisePlan::StridedInput* second = nullptr;
    for (const auto& s : p->strided) {
      if (plan.storage_of(s.storage) != storage) break;
      if (reads_half(s.map, out, g->n, half, 0)) first = &s;
      else if (reads_half(s.map, out, g->n, half, half)) second = &s;
    }
    if (first == nullptr || second == nullptr) continue;
    g->paired = true;
    g->pair_first = first->input;
    g->pair_second = second->input;
    g->pair_nodes = p->nodes;
    g->out = p->out;
    plan.ops[i].label += "+" + plan.ops[static_cast<size_t>(reader)].label;
    remove[static_cast<size_t>(reader)] = true;
  }
  erase_steps(plan, remove);
}

}  // namespace kiln::passes
