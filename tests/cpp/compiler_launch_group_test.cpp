// Launch groups (passes/group_launches.cpp, ops/grid_loop.h): a decode
// layer's q rotary, k rotary + cache write and v cache write, read from one
// merged q|k|v projection, become one launch; the grouped kernel runs on the
// CPU (cuda_host_shim.h) and must give what the three steps give, on fresh
// random inputs. Steps that depend on each other stay apart.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "compiler_test_util.h"
#include "decode_qkv_graph.h"
#include "host_kernel.h"
#include "ops/grid_loop.h"
#include "ops/rotary_ops.h"
#include "ops/state_ops.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using engine::DType;

void check_grouped_decode_qkv(DType dt, int64_t q_heads, int64_t kv_heads, int64_t hd, int64_t slots,
                              std::mt19937& rng) {
  SCOPED_TRACE(std::string(engine::dtype_name(dt)) + " q_heads " + std::to_string(q_heads) + " kv_heads " +
               std::to_string(kv_heads));
  const int64_t width = (q_heads + 2 * kv_heads) * hd;
  ir::Graph g;
  const int qkv = g.add_input("qkv", dt, {1, 1, width});
  const testing::DecodeQkv d = testing::add_decode_qkv(g, qkv, q_heads, kv_heads, hd, slots);
  ASSERT_EQ(passes::fuse_rotary(g), 2);
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 3u) << "q rotary, k rotary + cache write, v cache write";
  EXPECT_EQ(passes::group_launches(plan), 2);
  ASSERT_EQ(plan.ops.size(), 1u);
  const auto* group = plan.ops[0].as<ops::LaunchGroupPlan>();
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(group->members.size(), 3u);
  std::vector<int> writes = plan.ops[0].all_writes();
  std::sort(writes.begin(), writes.end());
  std::vector<int> want_writes{d.q, d.k_out, d.v_out};
  std::sort(want_writes.begin(), want_writes.end());
  EXPECT_EQ(writes, want_writes);

  testing::TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  ASSERT_EQ(step.kind, engine::StepKind::kKernel);
  // Each member gets its own blocks: q's rotary needs more than one block of
  // 256 threads when q_heads * hd > 256.
  const uint32_t want_blocks = ops::grid_loop_blocks(q_heads * hd) + 2 * ops::grid_loop_blocks(kv_heads * hd);
  EXPECT_EQ(step.kernel.grid[0], want_blocks);

  std::vector<uint8_t> qkv_b = testing::random_elems(dt, width, rng, -2.0f, 2.0f);
  testing::DecodeQkvBuffers b = testing::decode_qkv_buffers(d, dt, rng);
  // The kernel's arguments are graph value ids (TestLowerContext): each names
  // one of the buffers.
  std::map<uint32_t, void*> buffer{{static_cast<uint32_t>(qkv), qkv_b.data()}};
  testing::add_decode_qkv_buffers(buffer, d, b);
  std::vector<void*> pointers, args;
  testing::kernel_args(g, step.kernel, buffer, pointers, args);
  if (::testing::Test::HasFatalFailure()) return;
  testing::run_host_kernel(ctx.source(), step.kernel.function, "launch_group", args.data(), step.kernel.grid[0],
                           step.kernel.block[0], KILN_SHIM_HEADER);
  testing::check_decode_qkv(d, dt, qkv_b, b);
}

TEST(LaunchGroup, DecodeQkvRotaryAndCacheWritesAreOneLaunch) {
  std::mt19937 rng(std::random_device{}());
  check_grouped_decode_qkv(DType::kFloat32, 2, 2, 16, 12, rng);
  check_grouped_decode_qkv(DType::kFloat16, 8, 2, 64, 40, rng);  // grouped-query: q 512 elements, two blocks
  check_grouped_decode_qkv(DType::kBFloat16, 4, 4, 32, 7, rng);
}

// A rotary read by a cache write of the same group would race: the write
// reads what the rotary writes, so the two stay separate launches.
TEST(LaunchGroup, DependentStepsStayApart) {
  const DType dt = DType::kFloat32;
  const int64_t hd = 8;
  ir::Graph g;
  const int kc = g.add_state("k_cache", dt, {1, 1, 4, hd}, "kiln/test/state/k_cache");
  const int x = g.add_input("x", dt, {1, 1, 1, hd}), pos = g.add_input("pos", DType::kInt64, {1});
  const int cos = g.add_input("cos", dt, {1, 1, 1, hd}), sin = g.add_input("sin", dt, {1, 1, 1, hd});
  const int r = testing::hf_rope(g, x, cos, sin);
  testing::cache_write(g, kc, pos, r);
  g.set_outputs({r});  // a second reader: the rotary keeps its own step
  ASSERT_EQ(passes::fuse_rotary(g), 1);
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 2u);
  EXPECT_EQ(passes::group_launches(plan), 0);
  EXPECT_EQ(plan.ops.size(), 2u);
  for (const ops::PlannedOp& op : plan.ops) EXPECT_FALSE(op.is<ops::LaunchGroupPlan>()) << op.label;
}

}  // namespace
}  // namespace kiln
