#include "passes/exec_plan.h"

namespace kiln::passes {

std::vector<bool> kept_storage(const ir::Graph& graph, const ExecPlan& plan) {
  std::vector<bool> kept(graph.values().size(), false);
  for (int id : graph.outputs()) kept[static_cast<size_t>(plan.storage_of(id))] = true;
  for (const ir::State& st : graph.states())
    if (st.update >= 0) kept[static_cast<size_t>(plan.storage_of(st.update))] = true;
  return kept;
}

int sole_step_reader(const ExecPlan& plan, size_t producer, int storage, const std::vector<bool>& skip) {
  int reader = -1;
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    if (j == producer || (j < skip.size() && skip[j])) continue;
    for (int r : plan.ops[j].reads())
      if (plan.storage_of(r) == storage) {
        if (reader >= 0 && reader != static_cast<int>(j)) return -2;
        reader = static_cast<int>(j);
      }
  }
  return reader;
}

void erase_steps(ExecPlan& plan, const std::vector<bool>& remove) {
  std::vector<PlannedOp> kept;
  for (size_t i = 0; i < plan.ops.size(); ++i)
    if (i >= remove.size() || !remove[i]) kept.push_back(std::move(plan.ops[i]));
  plan.ops = std::move(kept);
}

}  // namespace kiln::passes
