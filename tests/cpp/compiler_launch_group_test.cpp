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
#include "host_kernel.h"
#include "ops/grid_loop.h"
#include "ops/rotary_ops.h"
#include "ops/state_ops.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using engine::DType;
using Shape = std::vector<int64_t>;
using testing::out0;
using testing::read_elem;
using testing::round_to;
using testing::slice_last;
using testing::write_elem;


// Heads [start, start + n) of a [1, 1, width] projection as [1, n, 1, hd].
int heads_of(ir::Graph& g, int qkv, int64_t start, int64_t n, int64_t hd) {
  const DType dt = g.value(qkv).dtype;
  const int s = slice_last(g, qkv, start * hd, (start + n) * hd);
  const int v = out0(g, g.add_node("aten.view_copy.default", "view", {s}, {{"size", Shape{1, 1, n, hd}}},
                                   {{dt, {1, 1, n, hd}}}));
  return out0(g, g.add_node("aten.permute_copy.default", "perm", {v}, {{"dims", Shape{0, 2, 1, 3}}},
                            {{dt, {1, n, 1, hd}}}));
}

// HF's rotate_half rotary as torch.export writes it.
int rope(ir::Graph& g, int x, int cos, int sin) {
  const Shape xs = g.value(x).shape;
  const DType dt = g.value(x).dtype;
  const int64_t d = xs.back();
  const int x2 = slice_last(g, x, d / 2, d), x1 = slice_last(g, x, 0, d / 2);
  const int neg = out0(g, g.add_node("aten.neg.default", "neg", {x2}, {}, {{dt, g.value(x2).shape}}));
  const int cat = out0(g, g.add_node("aten.cat.default", "cat", {neg, x1}, {{"dim", int64_t{-1}}}, {{dt, xs}}));
  const int m1 = out0(g, g.add_node("aten.mul.Tensor", "mul_cos", {x, cos}, {}, {{dt, xs}}));
  const int m2 = out0(g, g.add_node("aten.mul.Tensor", "mul_sin", {sin, cat}, {}, {{dt, xs}}));
  return out0(g, g.add_node("aten.add.Tensor", "add", {m2, m1}, {}, {{dt, xs}}));
}

int cache_write(ir::Graph& g, int cache, int pos, int values) {
  const int node = g.add_node("aten.index_put.default", "update", {cache, pos, values},
                              {{"indices_count", int64_t{1}}, {"indices_positions", Shape{2}}, {"accumulate", false}},
                              {{g.value(cache).dtype, g.value(cache).shape}});
  g.set_state_update(cache, out0(g, node));
  return out0(g, node);
}

void check_decode_qkv(DType dt, int64_t q_heads, int64_t kv_heads, int64_t hd, int64_t slots, std::mt19937& rng) {
  SCOPED_TRACE(std::string(engine::dtype_name(dt)) + " q_heads " + std::to_string(q_heads) + " kv_heads " +
               std::to_string(kv_heads));
  const int64_t width = (q_heads + 2 * kv_heads) * hd;
  const Shape cache_shape{1, kv_heads, slots, hd};
  ir::Graph g;
  const int kc = g.add_state("k_cache", dt, cache_shape, "kiln/test/state/k_cache");
  const int vc = g.add_state("v_cache", dt, cache_shape, "kiln/test/state/v_cache");
  const int qkv = g.add_input("qkv", dt, {1, 1, width});
  const int pos = g.add_input("pos", DType::kInt64, {1});
  const int cos = g.add_input("cos", dt, {1, 1, 1, hd}), sin = g.add_input("sin", dt, {1, 1, 1, hd});
  const int q = rope(g, heads_of(g, qkv, 0, q_heads, hd), cos, sin);
  const int k_out = cache_write(g, kc, pos, rope(g, heads_of(g, qkv, q_heads, kv_heads, hd), cos, sin));
  const int v_out = cache_write(g, vc, pos, heads_of(g, qkv, q_heads + kv_heads, kv_heads, hd));
  g.set_outputs({q});
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
  std::vector<int> want_writes{q, k_out, v_out};
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

  auto random = [&](int64_t n) { return testing::random_elems(dt, n, rng, -2.0f, 2.0f); };
  std::vector<uint8_t> qkv_b = random(width), cos_b = random(hd), sin_b = random(hd);
  std::vector<uint8_t> k_cache = random(kv_heads * slots * hd), v_cache = random(kv_heads * slots * hd);
  const std::vector<uint8_t> k_before = k_cache, v_before = v_cache;
  std::vector<uint8_t> q_b(static_cast<size_t>(q_heads * hd) * engine::dtype_size(dt));
  const int64_t slot = std::uniform_int_distribution<int64_t>(0, slots - 1)(rng);
  std::vector<int64_t> pos_b{slot};
  // The kernel's arguments are graph value ids (TestLowerContext): each names
  // one of the buffers; the updates' results are the caches' storage.
  const std::map<uint32_t, void*> buffer{{static_cast<uint32_t>(qkv), qkv_b.data()}, {static_cast<uint32_t>(pos), pos_b.data()},
                                         {static_cast<uint32_t>(cos), cos_b.data()}, {static_cast<uint32_t>(sin), sin_b.data()},
                                         {static_cast<uint32_t>(q), q_b.data()}, {static_cast<uint32_t>(k_out), k_cache.data()},
                                         {static_cast<uint32_t>(v_out), v_cache.data()}};
  std::vector<void*> pointers;
  for (const engine::KernelArg& a : step.kernel.args) {
    ASSERT_EQ(a.kind, engine::KernelArgKind::kTensor);
    auto it = buffer.find(a.tensor);
    ASSERT_NE(it, buffer.end()) << "argument names value " << g.value(static_cast<int>(a.tensor)).name;
    pointers.push_back(it->second);
  }
  std::vector<void*> args;
  for (void*& p : pointers) args.push_back(&p);
  testing::run_host_kernel(ctx.source(), step.kernel.function, "launch_group", args.data(), step.kernel.grid[0],
                           step.kernel.block[0], KILN_SHIM_HEADER);

  const double tol = dt == DType::kFloat32 ? 1e-5 : dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
  auto x = [&](int64_t head, int64_t j) { return read_elem(dt, qkv_b, static_cast<size_t>(head * hd + j)); };
  auto rotary = [&](int64_t head, int64_t j) {
    const int64_t h = hd / 2;
    const double r = j < h ? -x(head, j + h) : x(head, j - h);
    return round_to(dt, x(head, j) * read_elem(dt, cos_b, static_cast<size_t>(j)) +
                            r * read_elem(dt, sin_b, static_cast<size_t>(j)));
  };
  for (int64_t head = 0; head < q_heads; ++head)
    for (int64_t j = 0; j < hd; ++j) {
      const double want = rotary(head, j);
      ASSERT_NEAR(read_elem(dt, q_b, static_cast<size_t>(head * hd + j)), want, tol * (1.0 + std::fabs(want)))
          << "q head " << head << " element " << j;
    }
  for (int64_t head = 0; head < kv_heads; ++head)
    for (int64_t s = 0; s < slots; ++s)
      for (int64_t j = 0; j < hd; ++j) {
        const size_t at = static_cast<size_t>((head * slots + s) * hd + j);
        const double k_want = s == slot ? rotary(q_heads + head, j) : read_elem(dt, k_before, at);
        const double v_want = s == slot ? x(q_heads + kv_heads + head, j) : read_elem(dt, v_before, at);
        ASSERT_NEAR(read_elem(dt, k_cache, at), k_want, tol * (1.0 + std::fabs(k_want)))
            << "k cache head " << head << " slot " << s << " element " << j;
        ASSERT_EQ(read_elem(dt, v_cache, at), v_want) << "v cache head " << head << " slot " << s << " element " << j;
      }
}

TEST(LaunchGroup, DecodeQkvRotaryAndCacheWritesAreOneLaunch) {
  std::mt19937 rng(std::random_device{}());
  check_decode_qkv(DType::kFloat32, 2, 2, 16, 12, rng);
  check_decode_qkv(DType::kFloat16, 8, 2, 64, 40, rng);  // grouped-query: q 512 elements, two blocks
  check_decode_qkv(DType::kBFloat16, 4, 4, 32, 7, rng);
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
  const int r = rope(g, x, cos, sin);
  cache_write(g, kc, pos, r);
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
