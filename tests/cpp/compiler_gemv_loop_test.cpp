// A decode layer's q|k|v projection running the launch group after it in its
// own epilogue (passes/gemv_loop_epilogue.cpp, GemmPlan::loop_members): a
// warp computes a column and its rotary partner half a head away, stores
// both, then writes q's rotary and the k and v cache rows of those columns.
// The kernel runs on the CPU (cuda_block_shim.h) against the projection and
// the rotary computed here, on fresh random inputs; a second reader of the
// projection keeps the launch group.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "compiler_test_util.h"
#include "decode_qkv_graph.h"
#include "host_kernel.h"
#include "codegen/grid_dependency.h"
#include "codegen/nvrtc_compiler.h"
#include "ops/elementwise_kernel.h"
#include "ops/gemv_kernel.h"
#include "ops/grid_loop.h"
#include "passes/passes.h"

#ifndef KILN_BLOCK_SHIM_HEADER
#error "KILN_BLOCK_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;

struct Case {
  DType dt;
  int64_t k, q_heads, kv_heads, hd, slots;
  bool bias, early;
};

// x [1, 1, k] -> linear (the merged q|k|v weight [width, k], a bias
// optional) -> the decode tail: the graph's values.
struct QkvGraph {
  ir::Graph g;
  int x = -1, w = -1, bias = -1, qkv = -1;
  testing::DecodeQkv d;
};
void build_qkv(QkvGraph& q, DType dt, int64_t k, int64_t q_heads, int64_t kv_heads, int64_t hd, int64_t slots,
               bool bias, std::mt19937& rng) {
  const int64_t width = (q_heads + 2 * kv_heads) * hd;
  ir::Graph& g = q.g;
  q.x = g.add_input("x", dt, {1, 1, k});
  q.w = g.add_constant("w", dt, {width, k}, testing::random_elems(dt, width * k, rng, -1.0f, 1.0f));
  std::vector<int> inputs{q.x, q.w};
  if (bias) inputs.push_back(q.bias = g.add_constant("b", dt, {width}, testing::random_elems(dt, width, rng, -1.0f, 1.0f)));
  q.qkv = testing::out0(g, g.add_node("aten.linear.default", "qkv", inputs, {}, {{dt, {1, 1, width}}}));
  q.d = testing::add_decode_qkv(g, q.qkv, q_heads, kv_heads, hd, slots);
}

void check_projection_runs_the_group(const Case& c, int index, std::mt19937& rng) {
  SCOPED_TRACE(std::string(engine::dtype_name(c.dt)) + " k " + std::to_string(c.k) + " q_heads " +
               std::to_string(c.q_heads) + " kv_heads " + std::to_string(c.kv_heads) + " hd " + std::to_string(c.hd) +
               (c.bias ? " bias" : "") + (c.early ? " early weights" : ""));
  const int64_t width = (c.q_heads + 2 * c.kv_heads) * c.hd;
  QkvGraph q;
  build_qkv(q, c.dt, c.k, c.q_heads, c.kv_heads, c.hd, c.slots, c.bias, rng);
  ir::Graph& g = q.g;
  const int x = q.x, w = q.w, qkv = q.qkv;
  const testing::DecodeQkv& d = q.d;
  ASSERT_EQ(passes::fuse_rotary(g), 2);
  ops::OpOptions options;
  options.overlap_launches = c.early;
  passes::ExecPlan plan = passes::fuse(g, options);
  passes::group_launches(plan);
  ASSERT_EQ(plan.ops.size(), 2u) << "the projection, then the launch group";
  EXPECT_EQ(passes::plan_gemv_loop_epilogues(g, plan), 1);
  ASSERT_EQ(plan.ops.size(), 1u);
  const auto* gemm = plan.ops[0].as<ops::GemmPlan>();
  ASSERT_NE(gemm, nullptr);
  ASSERT_EQ(gemm->loop_members.size(), 3u);
  EXPECT_EQ(gemm->loop_half, c.hd / 2);
  EXPECT_EQ(gemm->early_weights, c.early);
  std::vector<int> writes = plan.ops[0].all_writes();
  std::sort(writes.begin(), writes.end());
  std::vector<int> want_writes{qkv, d.q, d.k_out, d.v_out};
  std::sort(want_writes.begin(), want_writes.end());
  EXPECT_EQ(writes, want_writes);

  testing::TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  ASSERT_EQ(step.kind, engine::StepKind::kKernel);
  const std::string tag = "gemv_loop_" + std::to_string(index);
  const testing::BlockLaunch launch = testing::block_launcher(ctx.source(), step.kernel.function, tag, KILN_BLOCK_SHIM_HEADER);
  ASSERT_NE(launch, nullptr);

  std::vector<uint8_t> x_b = testing::random_elems(c.dt, c.k, rng, -2.0f, 2.0f);
  std::vector<uint8_t> qkv_b(static_cast<size_t>(width) * engine::dtype_size(c.dt));
  testing::DecodeQkvBuffers b = testing::decode_qkv_buffers(d, c.dt, rng);
  std::map<uint32_t, void*> buffer{{static_cast<uint32_t>(x), x_b.data()},
                                   {static_cast<uint32_t>(w), const_cast<uint8_t*>(g.value(w).data.data())},
                                   {static_cast<uint32_t>(qkv), qkv_b.data()}};
  testing::add_decode_qkv_buffers(buffer, d, b);
  if (c.bias) buffer[static_cast<uint32_t>(q.bias)] = const_cast<uint8_t*>(g.value(q.bias).data.data());
  std::vector<void*> pointers, args;
  testing::kernel_args(g, step.kernel, buffer, pointers, args);
  if (::testing::Test::HasFatalFailure()) return;
  launch(args.data(), step.kernel.grid[0], step.kernel.block[0]);

  // The projection itself, against a double reference; then the tail from
  // the projection's stored values.
  const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
  const std::vector<uint8_t>& wb = g.value(w).data;
  for (int64_t j = 0; j < width; ++j) {
    double want = 0, mag = 0;
    for (int64_t e = 0; e < c.k; ++e) {
      const double t = testing::read_elem(c.dt, x_b, static_cast<size_t>(e)) *
                       testing::read_elem(c.dt, wb, static_cast<size_t>(j * c.k + e));
      want += t;
      mag += std::fabs(t);
    }
    if (c.bias) want += testing::read_elem(c.dt, g.value(q.bias).data, static_cast<size_t>(j));
    want = testing::round_to(c.dt, want);
    ASSERT_NEAR(testing::read_elem(c.dt, qkv_b, static_cast<size_t>(j)), want, tol * (1.0 + std::fabs(want)) + 1e-6 * mag)
        << "column " << j;
  }
  testing::check_decode_qkv(d, c.dt, qkv_b, b);
}

TEST(GemvLoopEpilogue, TheProjectionWritesTheRotaryAndTheCacheRows) {
  std::mt19937 rng(std::random_device{}());
  int index = 0;
  for (const Case& c : {Case{DType::kFloat32, 128, 2, 2, 16, 12, false, false},
                        // the 410M decode's heads (16 q, 8 kv of 64), a shorter row
                        Case{DType::kBFloat16, 256, 16, 8, 64, 40, false, true},
                        Case{DType::kFloat16, 512, 8, 2, 64, 9, true, true},
                        Case{DType::kBFloat16, 128, 4, 4, 32, 7, true, false}})
    check_projection_runs_the_group(c, index++, rng);
}

// With programmatic launch the projection triggers its successor (the
// attention) only after its products, not at its top: in the sm_90 PTX the
// first weight loads, then the wait, then the trigger, once each.
TEST(GemvLoopEpilogue, TheTriggerComesAfterTheProducts) {
  std::mt19937 rng(5);
  QkvGraph q;
  build_qkv(q, DType::kBFloat16, 256, 4, 2, 64, 16, false, rng);
  ir::Graph& g = q.g;
  ASSERT_EQ(passes::fuse_rotary(g), 2);
  ops::OpOptions options;
  options.overlap_launches = true;
  passes::ExecPlan plan = passes::fuse(g, options);
  passes::group_launches(plan);
  ASSERT_EQ(passes::plan_gemv_loop_epilogues(g, plan), 1);
  testing::TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  const engine::KernelModule module =
      codegen::compile_module("m", ops::pointwise_prelude() + ctx.source(), {80, 90}, true, {}, true);
  const std::string patched = codegen::add_grid_dependency(module.ptx);
  ASSERT_EQ(testing::count_of(patched, "griddepcontrol.wait;"), 1u);
  ASSERT_EQ(testing::count_of(patched, "griddepcontrol.launch_dependents;"), 1u);
  const size_t load = patched.find("ld.global.nc"), wait = patched.find("griddepcontrol.wait;");
  const size_t trigger = patched.find("griddepcontrol.launch_dependents;");
  EXPECT_LT(load, wait);
  EXPECT_LT(wait, trigger);
  EXPECT_NE(patched.find("shfl", trigger), std::string::npos) << "the sums are reduced after the trigger";
}

// The projection's output read by another step too (here: a graph output)
// keeps the launch group.
TEST(GemvLoopEpilogue, ASecondReaderKeepsTheLaunchGroup) {
  std::mt19937 rng(3);
  QkvGraph q;
  build_qkv(q, DType::kBFloat16, 128, 2, 2, 32, 8, false, rng);
  ir::Graph& g = q.g;
  g.set_outputs({q.d.q, q.qkv});
  ASSERT_EQ(passes::fuse_rotary(g), 2);
  passes::ExecPlan plan = passes::fuse(g);
  passes::group_launches(plan);
  const size_t steps = plan.ops.size();
  EXPECT_EQ(passes::plan_gemv_loop_epilogues(g, plan), 0);
  EXPECT_EQ(plan.ops.size(), steps);
}

}  // namespace
}  // namespace kiln
