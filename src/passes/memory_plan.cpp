// Activation arena planning: each intermediate tensor lives from the op that
// writes it to the last op that reads it; tensors whose lifetimes do not
// overlap share bytes. Greedy: place the largest tensors first, each at the
// lowest aligned offset that does not collide with an overlapping tensor.
#include <algorithm>
#include <numeric>

#include "passes/passes.h"

namespace kiln::passes {

ArenaPlan plan_arena(const std::vector<ArenaRequest>& requests) {
  ArenaPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests[a].nbytes > requests[b].nbytes; });
  auto align = [](uint64_t x) { return (x + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; };

  std::vector<size_t> placed;
  for (size_t r : order) {
    const ArenaRequest& req = requests[r];
    if (req.last_op < req.first_op) throw CompileError("arena request with a negative lifetime");
    // Intervals of already placed tensors alive at the same time, by offset.
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (size_t p : placed) {
      const ArenaRequest& o = requests[p];
      if (o.first_op <= req.last_op && req.first_op <= o.last_op)
        busy.emplace_back(plan.offsets[p], plan.offsets[p] + align(o.nbytes));
    }
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    uint64_t size = align(std::max<uint64_t>(req.nbytes, 1));
    for (const auto& [begin, end] : busy) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    plan.offsets[r] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(r);
  }
  return plan;
}

}  // namespace kiln::passes
