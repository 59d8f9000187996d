// Ops a language model's decode step needs, no GPU needed: argmax (greedy
// token choice on the device), the fused rotary embedding (kiln.rotary,
// made by passes/fuse_rotary.cpp from HF's rotate_half form), the KV-cache
// update (the decode-shaped attention: compiler_decode_attention_test.cpp;
// the matrix-vector kernels: compiler_gemv_test.cpp). Graphs go
// through the passes and fusion; each generated kernel is compiled as host
// C++ (argmax through cuda_block_shim.h: its threads cooperate) and compared
// with a reference computed here on fresh random inputs.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/argmax_ops.h"
#include "ops/attention_kernel.h"
#include "ops/rotary_ops.h"
#include "ops/state_ops.h"
#include "passes/passes.h"

#ifndef KILN_BLOCK_SHIM_HEADER
#error "KILN_BLOCK_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using testing::read_elem;
using testing::round_to;
using testing::write_elem;
using Shape = std::vector<int64_t>;
using Attrs = std::map<std::string, ir::Attr>;

std::vector<uint8_t> random_bytes(DType d, int64_t count, std::mt19937& rng) {
  return testing::random_elems(d, count, rng, -3.0f, 3.0f);
}
using testing::out0;
using testing::slice_last;
using testing::TestLowerContext;

using testing::BlockLaunch;
BlockLaunch block_launcher(const std::string& source, const std::string& fn, const std::string& tag) {
  return testing::block_launcher(source, fn, tag, KILN_BLOCK_SHIM_HEADER);
}

// ---- argmax ----------------------------------------------------------------

struct ArgmaxCase {
  std::string name;
  Shape shape;
  int64_t dim;  // -100: dim=None
  DType dtype;
  enum Fill { kRandom, kTies, kNaN, kAllNegInf } fill = kRandom;
};

void check_argmax(const ArgmaxCase& c, std::mt19937& rng) {
  SCOPED_TRACE(c.name);
  ir::Graph g;
  const int x = g.add_input("x", c.dtype, c.shape);
  Attrs attrs;
  Shape out_shape;
  int64_t dim = -1;
  if (c.dim != -100) {
    attrs["dim"] = c.dim;
    dim = c.dim < 0 ? c.dim + static_cast<int64_t>(c.shape.size()) : c.dim;
    for (size_t d = 0; d < c.shape.size(); ++d)
      if (static_cast<int64_t>(d) != dim) out_shape.push_back(c.shape[d]);
  }
  const int node = g.add_node("aten.argmax.default", "argmax", {x}, attrs, {{DType::kInt64, out_shape}});
  g.set_outputs({out0(g, node)});
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u);
  ASSERT_TRUE(plan.ops[0].is<ops::ArgmaxPlan>());
  TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  const BlockLaunch launch = block_launcher(ctx.source(), step.kernel.function, "argmax_" + c.name);
  ASSERT_NE(launch, nullptr);

  const int64_t n = ir::numel_of(c.shape);
  std::vector<uint8_t> xb = random_bytes(c.dtype, n, rng);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  if (c.fill == ArgmaxCase::kTies)  // the maximum several times: the first wins
    for (int k = 0; k < 6; ++k) write_elem(c.dtype, xb, static_cast<size_t>(pick(rng)), 7.0f);
  if (c.fill == ArgmaxCase::kNaN)  // NaN beats every number, the first NaN wins
    for (int k = 0; k < 3; ++k) write_elem(c.dtype, xb, static_cast<size_t>(pick(rng)), NAN);
  if (c.fill == ArgmaxCase::kAllNegInf)
    for (int64_t i = 0; i < n; ++i) write_elem(c.dtype, xb, static_cast<size_t>(i), -INFINITY);
  // Reference: PyTorch's rule, in the input's own precision.
  int64_t outer = 1, red = n, inner = 1;
  if (dim >= 0) {
    red = c.shape[static_cast<size_t>(dim)];
    for (int64_t d = 0; d < static_cast<int64_t>(c.shape.size()); ++d) {
      if (d < dim) outer *= c.shape[static_cast<size_t>(d)];
      if (d > dim) inner *= c.shape[static_cast<size_t>(d)];
    }
  }
  std::vector<int64_t> ref(static_cast<size_t>(outer * inner));
  for (int64_t o = 0; o < outer * inner; ++o) {
    int64_t best = 0;
    double bv = 0;
    for (int64_t r = 0; r < red; ++r) {
      const double v = read_elem(c.dtype, xb, static_cast<size_t>((o / inner) * red * inner + r * inner + o % inner));
      const bool better = r == 0 || (std::isnan(v) && !std::isnan(bv)) || (!std::isnan(bv) && v > bv);
      if (better) {
        best = r;
        bv = v;
      }
    }
    ref[static_cast<size_t>(o)] = best;
  }
  std::vector<int64_t> got(ref.size() + 2, -7);
  void* out_ptr = got.data() + 1;
  void* in_ptr = xb.data();
  void* args[] = {&out_ptr, &in_ptr};
  launch(args, step.kernel.grid[0], step.kernel.block[0]);
  EXPECT_EQ(got.front(), -7) << "wrote before the output";
  EXPECT_EQ(got.back(), -7) << "wrote past the output";
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i + 1], ref[i]) << "output " << i;
}

TEST(DecodeOps, ArgmaxMatchesPyTorchRules) {
  std::mt19937 rng(std::random_device{}());
  const std::vector<ArgmaxCase> cases = {
      {"vocab_row_f32", {1, 5003}, -1, DType::kFloat32},
      {"vocab_row_f16", {1, 4099}, 1, DType::kFloat16},
      {"vocab_row_bf16", {2, 3001}, -1, DType::kBFloat16},
      {"middle_dim", {3, 37, 5}, 1, DType::kFloat32},
      {"first_dim", {70, 4}, 0, DType::kFloat16},
      {"everything", {6, 9, 11}, -100, DType::kFloat32},
      {"ties_first_wins", {2, 700}, 1, DType::kFloat16, ArgmaxCase::kTies},
      {"nan_wins", {3, 900}, -1, DType::kFloat32, ArgmaxCase::kNaN},
      {"all_neg_inf", {2, 300}, -1, DType::kFloat32, ArgmaxCase::kAllNegInf},
      // Rows past kArgmaxLongRow: the 1024-thread block.
      {"long_row_bf16", {1, 32003}, -1, DType::kBFloat16},
      {"long_row_ties", {1, 9001}, 1, DType::kFloat16, ArgmaxCase::kTies},
      {"long_row_nan", {2, 8192}, -1, DType::kFloat32, ArgmaxCase::kNaN},
      {"long_middle_dim", {2, 8200, 3}, 1, DType::kFloat32},
  };
  for (const ArgmaxCase& c : cases) check_argmax(c, rng);
}

// ---- rotary ----------------------------------------------------------------

// x * cos + cat(-x[..., h + shift:], x[..., :h + shift]) * sin, as torch.export
// writes HF's apply_rotary_pos_emb (shift 0); `extra_reader` gives the cat
// a second reader.
ir::Graph rope_graph(DType dt, const Shape& xs, const Shape& cs, int64_t shift = 0, bool extra_reader = false) {
  ir::Graph g;
  const int x = g.add_input("x", dt, xs), cos = g.add_input("cos", dt, cs), sin = g.add_input("sin", dt, cs);
  const int64_t d = xs.back(), h = d / 2 + shift;
  const int x2 = slice_last(g, x, h, d), x1 = slice_last(g, x, 0, h);
  const int neg = out0(g, g.add_node("aten.neg.default", "neg", {x2}, {}, {{dt, g.value(x2).shape}}));
  const int cat = out0(g, g.add_node("aten.cat.default", "cat", {neg, x1}, {{"dim", int64_t{-1}}}, {{dt, xs}}));
  const int m1 = out0(g, g.add_node("aten.mul.Tensor", "mul_cos", {x, cos}, {}, {{dt, xs}}));
  const int m2 = out0(g, g.add_node("aten.mul.Tensor", "mul_sin", {sin, cat}, {}, {{dt, xs}}));
  const int y = out0(g, g.add_node("aten.add.Tensor", "add", {m2, m1}, {}, {{dt, xs}}));
  std::vector<int> outs{y};
  if (extra_reader) outs.push_back(out0(g, g.add_node("aten.relu.default", "relu", {cat}, {}, {{dt, xs}})));
  g.set_outputs(outs);
  return g;
}

TEST(DecodeOps, RotaryPatternFusesOnlyWhenExact) {
  ir::Graph g = rope_graph(DType::kFloat32, {1, 4, 3, 16}, {1, 1, 3, 16});
  EXPECT_EQ(passes::fuse_rotary(g), 1);
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u);
  EXPECT_EQ(plan.ops[0].label, "rotary");
  ir::Graph shifted = rope_graph(DType::kFloat32, {1, 4, 3, 16}, {1, 1, 3, 16}, 2);
  EXPECT_EQ(passes::fuse_rotary(shifted), 0) << "halves split off-centre are not rotate_half";
  ir::Graph shared = rope_graph(DType::kFloat32, {1, 4, 3, 16}, {1, 1, 3, 16}, 0, true);
  EXPECT_EQ(passes::fuse_rotary(shared), 0) << "the cat has another reader";
}

TEST(DecodeOps, RotaryKernelMatchesReference) {
  std::mt19937 rng(std::random_device{}());
  struct Case {
    DType dt;
    Shape xs, cs;
  };
  for (const Case& c : {Case{DType::kFloat32, {1, 4, 5, 16}, {1, 1, 5, 16}}, Case{DType::kFloat16, {1, 2, 7, 64}, {7, 64}},
                        Case{DType::kBFloat16, {1, 8, 1, 128}, {1, 1, 1, 128}}}) {
    SCOPED_TRACE(engine::dtype_name(c.dt) + std::string(" ") + ir::shape_to_string(c.xs));
    ir::Graph g = rope_graph(c.dt, c.xs, c.cs);
    ASSERT_EQ(passes::fuse_rotary(g), 1);
    passes::ExecPlan plan = passes::fuse(g);
    ASSERT_EQ(plan.ops.size(), 1u);
    TestLowerContext ctx(g);
    engine::Step step;
    plan.ops[0].plan->lower(ctx, step);
    const int64_t n = ir::numel_of(c.xs), cn = ir::numel_of(c.cs), d = c.xs.back(), h = d / 2;
    std::vector<uint8_t> xb = random_bytes(c.dt, n, rng), cb = random_bytes(c.dt, cn, rng),
                         sb = random_bytes(c.dt, cn, rng);
    std::vector<uint8_t> ob(static_cast<size_t>(n) * engine::dtype_size(c.dt));
    void* p[] = {ob.data(), xb.data(), cb.data(), sb.data()};
    void* args[] = {&p[0], &p[1], &p[2], &p[3]};
    testing::run_host_kernel(ctx.source(), step.kernel.function, "rotary", args,
                             step.kernel.grid[0], step.kernel.block[0], KILN_SHIM_HEADER);
    const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = i % d, ci = i % cn;  // cos/sin broadcast over the leading dims
      const double xv = read_elem(c.dt, xb, static_cast<size_t>(i));
      const double r = j < h ? -read_elem(c.dt, xb, static_cast<size_t>(i + h)) : read_elem(c.dt, xb, static_cast<size_t>(i - h));
      const double want = round_to(c.dt, xv * read_elem(c.dt, cb, static_cast<size_t>(ci)) +
                                             r * read_elem(c.dt, sb, static_cast<size_t>(ci)));
      const double got = read_elem(c.dt, ob, static_cast<size_t>(i));
      ASSERT_NEAR(got, want, tol * (1.0 + std::fabs(want))) << "element " << i;
    }
  }
}

// q and k as columns of one merged projection (passes/merge_linears.cpp):
// the rotary reads its x straight from the merged result through the
// slice -> view -> permute chain, whose layout kernel is then dropped.
TEST(DecodeOps, RotaryReadsAMergedProjectionThroughStrides) {
  std::mt19937 rng(std::random_device{}());
  const DType dt = DType::kFloat16;
  const int64_t heads = 2, hd = 16, width = 3 * heads * hd, start = heads * hd;  // the k columns
  ir::Graph g;
  const int m = g.add_input("qkv", dt, {1, 1, width});
  const int cos = g.add_input("cos", dt, {1, 1, 1, hd}), sin = g.add_input("sin", dt, {1, 1, 1, hd});
  const int k = slice_last(g, m, start, start + heads * hd);
  const int v4 = out0(g, g.add_node("aten.view_copy.default", "view", {k}, {{"size", Shape{1, 1, heads, hd}}},
                                    {{dt, {1, 1, heads, hd}}}));
  const Shape xs{1, heads, 1, hd};
  const int x = out0(g, g.add_node("aten.permute_copy.default", "perm", {v4}, {{"dims", Shape{0, 2, 1, 3}}},
                                   {{dt, xs}}));
  const int x2 = slice_last(g, x, hd / 2, hd), x1 = slice_last(g, x, 0, hd / 2);
  const int neg = out0(g, g.add_node("aten.neg.default", "neg", {x2}, {}, {{dt, g.value(x2).shape}}));
  const int cat = out0(g, g.add_node("aten.cat.default", "cat", {neg, x1}, {{"dim", int64_t{-1}}}, {{dt, xs}}));
  const int m1 = out0(g, g.add_node("aten.mul.Tensor", "mul_cos", {x, cos}, {}, {{dt, xs}}));
  const int m2 = out0(g, g.add_node("aten.mul.Tensor", "mul_sin", {sin, cat}, {}, {{dt, xs}}));
  g.set_outputs({out0(g, g.add_node("aten.add.Tensor", "add", {m2, m1}, {}, {{dt, xs}}))});
  ASSERT_EQ(passes::fuse_rotary(g), 1);
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u) << "the slice/permute kernel must be dropped";
  const auto* rotary = plan.ops[0].as<ops::RotaryPlan>();
  ASSERT_NE(rotary, nullptr);
  EXPECT_EQ(rotary->x_storage, m);
  TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  EXPECT_EQ(step.kernel.args[1].tensor, static_cast<uint32_t>(m));
  std::vector<uint8_t> mb = random_bytes(dt, width, rng), cb = random_bytes(dt, hd, rng), sb = random_bytes(dt, hd, rng);
  const int64_t n = heads * hd;
  std::vector<uint8_t> ob(static_cast<size_t>(n) * 2);
  void* p[] = {ob.data(), mb.data(), cb.data(), sb.data()};
  void* args[] = {&p[0], &p[1], &p[2], &p[3]};
  testing::run_host_kernel(ctx.source(), step.kernel.function, "rotary_strided", args, step.kernel.grid[0],
                           step.kernel.block[0], KILN_SHIM_HEADER);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = i % hd, h = hd / 2;
    auto xk = [&](int64_t e) { return read_elem(dt, mb, static_cast<size_t>(start + e)); };
    const double r = j < h ? -xk(i + h) : xk(i - h);
    const double want = round_to(dt, xk(i) * read_elem(dt, cb, static_cast<size_t>(j)) +
                                         r * read_elem(dt, sb, static_cast<size_t>(j)));
    ASSERT_NEAR(read_elem(dt, ob, static_cast<size_t>(i)), want, 2e-3 * (1.0 + std::fabs(want))) << "element " << i;
  }
}

// An MLP's gate and up as halves of one merged projection: silu(gate) * up
// is one elementwise kernel reading both halves in place (no slice kernels),
// with SiLU as one op or written out as gate * sigmoid(gate) (float32 HF
// models: the gate slice then has two readers, both in the kernel).
void check_silu_mul_reads_halves(bool written_out, std::mt19937& rng) {
  SCOPED_TRACE(written_out ? "gate * sigmoid(gate)" : "silu(gate)");
  const DType dt = DType::kFloat32;
  const int64_t rows = 3, inter = 40;
  ir::Graph g;
  const int gu = g.add_input("gate_up", dt, {1, rows, 2 * inter});
  const int gate = slice_last(g, gu, 0, inter), up = slice_last(g, gu, inter, 2 * inter);
  const Shape s{1, rows, inter};
  int act;
  if (written_out) {
    const int sg = out0(g, g.add_node("aten.sigmoid.default", "sigmoid", {gate}, {}, {{dt, s}}));
    act = out0(g, g.add_node("aten.mul.Tensor", "silu", {gate, sg}, {}, {{dt, s}}));
  } else {
    act = out0(g, g.add_node("aten.silu.default", "silu", {gate}, {}, {{dt, s}}));
  }
  g.set_outputs({out0(g, g.add_node("aten.mul.Tensor", "mul", {act, up}, {}, {{dt, s}}))});
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u) << "the slices must be read in place";
  TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  ASSERT_EQ(step.kernel.args.size(), 4u);  // out, gate, up, n
  EXPECT_EQ(step.kernel.args[1].tensor, static_cast<uint32_t>(gu));
  EXPECT_EQ(step.kernel.args[2].tensor, static_cast<uint32_t>(gu));
  const int64_t n = rows * inter;
  std::vector<uint8_t> in = random_bytes(dt, 2 * n, rng), ob(static_cast<size_t>(n) * 4);
  long long count = n;
  void* p[] = {ob.data(), in.data(), in.data()};
  void* args[] = {&p[0], &p[1], &p[2], &count};
  testing::run_host_kernel(ctx.source(), step.kernel.function, written_out ? "silu_written_out" : "pointwise_strided",
                           args, step.kernel.grid[0], step.kernel.block[0], KILN_SHIM_HEADER);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / inter, c = i % inter;
    const double a = read_elem(dt, in, static_cast<size_t>(r * 2 * inter + c));
    const double b = read_elem(dt, in, static_cast<size_t>(r * 2 * inter + inter + c));
    const double want = a / (1.0 + std::exp(-a)) * b;
    ASSERT_NEAR(read_elem(dt, ob, static_cast<size_t>(i)), want, 1e-5 * (1.0 + std::fabs(want))) << "element " << i;
  }
}

TEST(DecodeOps, ElementwiseKernelReadsBothHalvesOfAMergedProjection) {
  std::mt19937 rng(std::random_device{}());
  check_silu_mul_reads_halves(false, rng);
  check_silu_mul_reads_halves(true, rng);
}

// ---- KV-cache update (index_put into a state), alone and with a rotary ----------

// cache[:, :, pos] = values on a [1, heads, slots, hd] state. With `rope`,
// values = rotary(x) (HF rotate_half; x a column slice of a merged
// projection read through strides when `merged`), which the update must
// compute itself: one kernel. `extra_reader` gives the rotary's result a
// second reader (then the rotary keeps its own kernel).
struct CacheCase {
  DType dt;
  int64_t heads, slots, hd, tokens;
  bool rope, merged, extra_reader;
};

void check_cache_update(const CacheCase& c, std::mt19937& rng) {
  SCOPED_TRACE(std::string(engine::dtype_name(c.dt)) + (c.rope ? " rope" : "") + (c.merged ? " merged" : "") +
               (c.extra_reader ? " extra_reader" : ""));
  const Shape cache_shape{1, c.heads, c.slots, c.hd}, xs{1, c.heads, c.tokens, c.hd};
  const int64_t width = 3 * c.heads * c.hd, start = c.heads * c.hd;  // the k columns of q|k|v
  ir::Graph g;
  const int state = g.add_state("k_cache", c.dt, cache_shape, "kiln/test/state/k_cache");
  const int pos = g.add_input("pos", DType::kInt64, {c.tokens});
  int x = -1, merged = -1;
  if (c.merged) {
    merged = g.add_input("qkv", c.dt, {1, c.tokens, width});
    const int k = slice_last(g, merged, start, start + c.heads * c.hd);
    const int v4 = out0(g, g.add_node("aten.view_copy.default", "view", {k}, {{"size", Shape{1, c.tokens, c.heads, c.hd}}},
                                      {{c.dt, {1, c.tokens, c.heads, c.hd}}}));
    x = out0(g, g.add_node("aten.permute_copy.default", "perm", {v4}, {{"dims", Shape{0, 2, 1, 3}}}, {{c.dt, xs}}));
  } else {
    x = g.add_input("x", c.dt, xs);
  }
  const int cos = g.add_input("cos", c.dt, {1, 1, c.tokens, c.hd}), sin = g.add_input("sin", c.dt, {1, 1, c.tokens, c.hd});
  int values = x, extra = -1;
  if (c.rope) {
    const int64_t h = c.hd / 2;
    const int x2 = slice_last(g, x, h, c.hd), x1 = slice_last(g, x, 0, h);
    const int neg = out0(g, g.add_node("aten.neg.default", "neg", {x2}, {}, {{c.dt, g.value(x2).shape}}));
    const int cat = out0(g, g.add_node("aten.cat.default", "cat", {neg, x1}, {{"dim", int64_t{-1}}}, {{c.dt, xs}}));
    const int m1 = out0(g, g.add_node("aten.mul.Tensor", "mul_cos", {x, cos}, {}, {{c.dt, xs}}));
    const int m2 = out0(g, g.add_node("aten.mul.Tensor", "mul_sin", {sin, cat}, {}, {{c.dt, xs}}));
    values = out0(g, g.add_node("aten.add.Tensor", "add", {m2, m1}, {}, {{c.dt, xs}}));
    if (c.extra_reader) extra = out0(g, g.add_node("aten.relu.default", "relu", {values}, {}, {{c.dt, xs}}));
  }
  const int node = g.add_node("aten.index_put.default", "update", {state, pos, values},
                              {{"indices_count", int64_t{1}}, {"indices_positions", Shape{2}}, {"accumulate", false}},
                              {{c.dt, cache_shape}});
  g.set_state_update(state, out0(g, node));
  g.set_outputs(extra >= 0 ? std::vector<int>{extra} : std::vector<int>{});
  if (c.rope) ASSERT_EQ(passes::fuse_rotary(g), 1);
  passes::ExecPlan plan = passes::fuse(g);
  const ops::StateScatterPlan* update = nullptr;
  int update_index = -1;
  for (size_t i = 0; i < plan.ops.size(); ++i)
    if (plan.ops[i].as<ops::StateScatterPlan>() != nullptr) {
      update = plan.ops[i].as<ops::StateScatterPlan>();
      update_index = static_cast<int>(i);
    }
  ASSERT_NE(update, nullptr);
  const bool fused = c.rope && !c.extra_reader;
  EXPECT_EQ(update->rotary_cos >= 0, fused);
  if (fused || !c.rope) {
    ASSERT_EQ(plan.ops.size(), 1u) << "one kernel: the update computes the rotary and reads x in place";
    EXPECT_EQ(plan.ops[0].label, fused ? "rotary_state_update" : "state_update");
  } else {
    EXPECT_EQ(plan.ops.size(), 3u) << "rotary, relu, update";  // the rotary has a second reader
  }
  if (c.merged && fused) EXPECT_EQ(update->values_storage, merged);
  TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[static_cast<size_t>(update_index)].plan->lower(ctx, step);

  // Inputs: a cache already holding data, distinct positions (one wraps
  // from negative, as PyTorch indexes), x, cos, sin.
  const size_t es = engine::dtype_size(c.dt);
  const int64_t cache_n = ir::numel_of(cache_shape), xn = ir::numel_of(xs), tn = c.tokens * c.hd;
  std::vector<uint8_t> cache = random_bytes(c.dt, cache_n, rng), before = cache;
  std::vector<int64_t> slots(static_cast<size_t>(c.slots));
  for (int64_t i = 0; i < c.slots; ++i) slots[static_cast<size_t>(i)] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<int64_t> positions(slots.begin(), slots.begin() + c.tokens);
  positions[0] -= c.slots;  // -k is slot slots-k
  std::vector<uint8_t> src = random_bytes(c.dt, c.merged ? c.tokens * width : xn, rng);
  std::vector<uint8_t> cb = random_bytes(c.dt, tn, rng), sb = random_bytes(c.dt, tn, rng);
  // Values through the source's layout: x[0, hh, t, j]
  auto xval = [&](int64_t hh, int64_t t, int64_t j) {
    const int64_t off = c.merged ? t * width + start + hh * c.hd + j : (hh * c.tokens + t) * c.hd + j;
    return read_elem(c.dt, src, static_cast<size_t>(off));
  };
  // The values (rotary or update-only), when the update lowered alone reads
  // the rotary's output: computed here and passed as its input.
  std::vector<uint8_t> vb(static_cast<size_t>(xn) * es);
  for (int64_t hh = 0; hh < c.heads; ++hh)
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t j = 0; j < c.hd; ++j) {
        double v = xval(hh, t, j);
        if (c.rope) {
          const int64_t h = c.hd / 2;
          const double r = j < h ? -xval(hh, t, j + h) : xval(hh, t, j - h);
          v = v * read_elem(c.dt, cb, static_cast<size_t>(t * c.hd + j)) + r * read_elem(c.dt, sb, static_cast<size_t>(t * c.hd + j));
        }
        write_elem(c.dt, vb, static_cast<size_t>((hh * c.tokens + t) * c.hd + j), static_cast<float>(round_to(c.dt, v)));
      }
  void* p[] = {cache.data(), positions.data(), (fused || !c.rope) ? src.data() : vb.data(), cb.data(), sb.data()};
  void* args[] = {&p[0], &p[1], &p[2], &p[3], &p[4]};
  ASSERT_EQ(step.kernel.args.size(), fused ? 5u : 3u);
  testing::run_host_kernel(ctx.source(), step.kernel.function, fused ? "rotary_cache" : "cache", args,
                           step.kernel.grid[0], step.kernel.block[0], KILN_SHIM_HEADER);
  const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
  std::vector<int64_t> token_of(static_cast<size_t>(c.slots), -1);
  for (int64_t t = 0; t < c.tokens; ++t)
    token_of[static_cast<size_t>((positions[static_cast<size_t>(t)] + c.slots) % c.slots)] = t;
  for (int64_t hh = 0; hh < c.heads; ++hh)
    for (int64_t slot = 0; slot < c.slots; ++slot)
      for (int64_t j = 0; j < c.hd; ++j) {
        const size_t at = static_cast<size_t>((hh * c.slots + slot) * c.hd + j);
        const int64_t t = token_of[static_cast<size_t>(slot)];
        const double want = t < 0 ? read_elem(c.dt, before, at)
                                  : read_elem(c.dt, vb, static_cast<size_t>((hh * c.tokens + t) * c.hd + j));
        ASSERT_NEAR(read_elem(c.dt, cache, at), want, tol * (1.0 + std::fabs(want)))
            << "head " << hh << " slot " << slot << " element " << j << (t < 0 ? " (not written)" : "");
      }
}

TEST(DecodeOps, CacheUpdateWritesOnlyTheIndexedSlots) {
  std::mt19937 rng(std::random_device{}());
  check_cache_update({DType::kFloat32, 2, 16, 8, 3, false, false, false}, rng);
  check_cache_update({DType::kFloat16, 4, 32, 16, 1, false, true, false}, rng);
}

TEST(DecodeOps, CacheUpdateComputesTheRotaryItStores) {
  std::mt19937 rng(std::random_device{}());
  check_cache_update({DType::kFloat32, 2, 16, 8, 3, true, false, false}, rng);
  check_cache_update({DType::kFloat16, 4, 32, 16, 1, true, true, false}, rng);  // decode: k of a merged qkv
  check_cache_update({DType::kBFloat16, 2, 24, 32, 5, true, true, false}, rng);
  check_cache_update({DType::kFloat32, 2, 16, 8, 2, true, false, true}, rng);  // a second reader: not fused
}

// A permute read by several elementwise ops keeps its copy: strided reads
// across rows would be uncoalesced (only last-dim slices are read in place
// by several readers, above).
TEST(DecodeOps, PermuteWithTwoElementwiseReadersKeepsItsCopy) {
  const DType dt = DType::kFloat32;
  ir::Graph h;
  const int x = h.add_input("x", dt, {1, 8, 16});
  const int t = out0(h, h.add_node("aten.permute_copy.default", "perm", {x}, {{"dims", Shape{0, 2, 1}}},
                                   {{dt, {1, 16, 8}}}));
  const int e = out0(h, h.add_node("aten.exp.default", "exp", {t}, {}, {{dt, {1, 16, 8}}}));
  const int m = out0(h, h.add_node("aten.mul.Tensor", "mul", {t, e}, {}, {{dt, {1, 16, 8}}}));
  h.set_outputs({m});
  passes::ExecPlan permuted = passes::fuse(h);
  ASSERT_EQ(permuted.ops.size(), 2u) << "permute copy + arithmetic";
}

}  // namespace
}  // namespace kiln
