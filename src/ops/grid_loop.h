// Kernels that are one grid-stride loop over independent iterations (the
// rotary, the cache updates). Such a step describes its loop as a GridLoop
// and lowers alone through lower_grid_loop, or shares one launch with its
// independent neighbours: a LaunchGroupPlan (formed by
// passes/group_launches.cpp) gives each member its own range of blocks, so
// a decode layer's q rotary, k rotary + cache write and v cache write are
// one launch instead of three. At batch 1 those kernels are a block or two
// each; the launch, not the work, is their cost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/step_plan.h"

namespace kiln::ops {

constexpr unsigned kGridLoopBlock = 256;

struct GridLoop {
  struct Param {
    std::string decl;  // its declaration without the name: "const float* __restrict__"
    std::string name;  // as the body names it
    engine::KernelArg arg;
  };
  std::vector<Param> params;
  int64_t count = 0;  // iterations
  std::string body;   // one iteration, `const long long i` its index; no block-wide sync
};

// A step plan whose kernel is a GridLoop.
class GridLoopStep {
 public:
  virtual ~GridLoopStep() = default;
  virtual GridLoop grid_loop(LowerContext& ctx) const = 0;
};

// Whether `op` is a GridLoopStep; the step itself (CompileError when not).
bool is_grid_loop(const PlannedOp& op);
const GridLoopStep& grid_loop_step(const PlannedOp& op);

// A kernel that runs several loops names member m's parameters m<m>_<name>:
// their declarations, and the lines (each after `indent`) that bind them back
// to the names the member's body uses. Without `keep_restrict` neither has
// __restrict__ (a member's pointer may alias the kernel's own output).
std::vector<std::string> grid_loop_member_params(const GridLoop& loop, size_t member, bool keep_restrict);
std::string grid_loop_member_bindings(const GridLoop& loop, size_t member, const std::string& indent,
                                      bool keep_restrict);

// Blocks of kGridLoopBlock threads for `count` iterations (at least 1, at
// most 65536; the loop strides over the rest).
uint32_t grid_loop_blocks(int64_t count);

// `step` as the loop's own kernel, named from `prefix`.
void lower_grid_loop(LowerContext& ctx, engine::Step& step, const std::string& prefix, const GridLoop& loop);

// Several GridLoopSteps in one launch. The members are independent: none
// reads or writes what another writes (group_launches checks storage), so
// their blocks may run in any order.
struct LaunchGroupPlan : StepPlanBase<LaunchGroupPlan> {
  std::vector<PlannedOp> members;  // each plan a GridLoopStep

  std::vector<int> reads() const override;
  int writes() const override { return members.front().writes(); }
  std::vector<int> also_writes() const override;
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

}  // namespace kiln::ops
