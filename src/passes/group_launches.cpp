// Launch groups: adjacent steps whose kernels are grid-stride loops
// (ops/grid_loop.h) and that do not depend on each other run as one launch.
// A decode layer's rotary of q, rotary + cache write of k and cache write of
// v are a block or two each; three launches cost more than their work.
#include <set>

#include "ops/grid_loop.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// Enough to take a layer's q, k and v steps and the like; keeps the kernel's
// parameter list short.
constexpr size_t kMaxMembers = 8;


std::set<int> storages(const ExecPlan& plan, const std::vector<int>& values) {
  std::set<int> s;
  for (int v : values) s.insert(plan.storage_of(v));
  return s;
}

bool meets(const std::set<int>& a, const std::set<int>& b) {
  for (int v : a)
    if (b.count(v)) return true;
  return false;
}

}  // namespace

int group_launches(ExecPlan& plan) {
  std::vector<PlannedOp> out;
  std::vector<PlannedOp> group;
  std::set<int> group_reads, group_writes;
  int merged = 0;
  auto flush = [&] {
    if (group.size() == 1) {
      out.push_back(std::move(group.front()));
    } else if (group.size() > 1) {
      ops::LaunchGroupPlan g;
      std::string label;
      for (PlannedOp& m : group) {
        label += (label.empty() ? "" : "+") + m.label;
        g.members.push_back(std::move(m));
      }
      merged += static_cast<int>(g.members.size()) - 1;
      out.push_back(PlannedOp(label, std::move(g)));
    }
    group.clear();
    group_reads.clear();
    group_writes.clear();
  };
  for (PlannedOp& op : plan.ops) {
    if (!ops::is_grid_loop(op)) {
      flush();
      out.push_back(std::move(op));
      continue;
    }
    const std::set<int> reads = storages(plan, op.reads()), writes = storages(plan, op.all_writes());
    // Independent of every member: reads nothing they write, writes nothing
    // they read or write.
    if (group.size() >= kMaxMembers || meets(reads, group_writes) || meets(writes, group_reads) ||
        meets(writes, group_writes))
      flush();
    group_reads.insert(reads.begin(), reads.end());
    group_writes.insert(writes.begin(), writes.end());
    group.push_back(std::move(op));
  }
  flush();
  plan.ops = std::move(out);
  return merged;
}

}  // namespace kiln::passes
