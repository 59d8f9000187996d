// The cumsum scan kernel, no GPU needed: a cumsum node goes through the
// passes and fusion into a CumsumPlan, its generated CUDA source is compiled
// as host C++ through cuda_host_shim.h and run on the CPU thread by thread on
// fresh random inputs, and every output is compared with a reference written
// here: each input converted to the output's kind as PyTorch does, then
// into a float output summed in float in index order and rounded once to the
// output dtype (what the kernel promises, so bit for bit), into an integer
// output summed exactly in 64 bits (values past 2^24 and 2^31, where float
// or int32 would round or wrap), floats truncated toward zero. Refusals name the problem. A failure prints
// KILN_TEST_SEED=<n>; set it to replay the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/dim_arg.h"
#include "ops/op_registry.h"
#include "ops/scan_ops.h"
#include "passes/passes.h"

#ifndef KILN_SHIM_HEADER
#error "KILN_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using testing::out0;
using testing::read_elem;
using testing::round_to;
using testing::TestLowerContext;
using Shape = std::vector<int64_t>;

struct ScanCase {
  std::string name;
  Shape shape;
  int64_t dim;
  DType in, out;
};

bool is_float(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

// Random elements of `d`: floats in [-3, 3); integers anywhere in
// +-2^40 (int64) or +-2^30 (int32), so their sums pass 2^31; bools 0/1.
std::vector<uint8_t> random_input(DType d, int64_t n, std::mt19937& rng) {
  if (is_float(d)) return testing::random_elems(d, n, rng, -3.0f, 3.0f);
  std::vector<uint8_t> b(static_cast<size_t>(n) * engine::dtype_size(d));
  std::uniform_int_distribution<int64_t> wide(-(int64_t{1} << 40), int64_t{1} << 40);
  std::uniform_int_distribution<int32_t> narrow(-(1 << 30), 1 << 30);
  for (int64_t i = 0; i < n; ++i) {
    if (d == DType::kInt64) {
      const int64_t v = wide(rng);
      std::memcpy(&b[static_cast<size_t>(i) * 8], &v, 8);
    } else if (d == DType::kInt32) {
      const int32_t v = narrow(rng);
      std::memcpy(&b[static_cast<size_t>(i) * 4], &v, 4);
    } else {
      b[static_cast<size_t>(i)] = static_cast<uint8_t>(rng() & 1);
    }
  }
  return b;
}

int64_t int_elem(DType d, const std::vector<uint8_t>& b, size_t i) {
  if (d == DType::kInt64) {
    int64_t v;
    std::memcpy(&v, &b[i * 8], 8);
    return v;
  }
  if (d == DType::kInt32) {
    int32_t v;
    std::memcpy(&v, &b[i * 4], 4);
    return v;
  }
  return b[i];  // bool
}

void check_scan(const ScanCase& c, std::mt19937& rng) {
  SCOPED_TRACE(c.name);
  ir::Graph g;
  const int x = g.add_input("x", c.in, c.shape);
  const int node = g.add_node("aten.cumsum.default", "cumsum", {x}, {{"dim", c.dim}}, {{c.out, c.shape}});
  g.set_outputs({out0(g, node)});

  // The capability check takes the node; fusion plans it as one scan.
  ops::OpQuery q{"aten.cumsum.default", {{c.in, c.shape, false}}, {{"dim", c.dim}}, {{c.out, c.shape, false}}};
  ASSERT_TRUE(ops::check_cumsum(q).empty()) << ops::check_cumsum(q);
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u);
  const ops::CumsumPlan* p = plan.ops[0].as<ops::CumsumPlan>();
  ASSERT_NE(p, nullptr);
  TestLowerContext ctx(g);
  engine::Step step;
  p->lower(ctx, step);
  ASSERT_EQ(step.kind, engine::StepKind::kKernel);
  ASSERT_EQ(step.kernel.block[0], ops::kScanBlock);

  const int64_t n = ir::numel_of(c.shape);
  const size_t out_size = engine::dtype_size(c.out);
  std::vector<uint8_t> xb = random_input(c.in, n, rng);
  // Guard elements before and after the output catch stray writes.
  std::vector<uint8_t> yb((static_cast<size_t>(n) + 2) * out_size, 0xa5);
  void* out_ptr = yb.data() + out_size;
  void* in_ptr = xb.data();
  void* args[] = {&out_ptr, &in_ptr};
  testing::run_host_kernel(ctx.source(), step.kernel.function, "scan_" + c.name, args, step.kernel.grid[0],
                           step.kernel.block[0], KILN_SHIM_HEADER);
  for (size_t b = 0; b < out_size; ++b) {
    EXPECT_EQ(yb[b], 0xa5) << "wrote before the output";
    EXPECT_EQ(yb[yb.size() - 1 - b], 0xa5) << "wrote past the output";
  }
  const std::vector<uint8_t> got(yb.begin() + static_cast<std::ptrdiff_t>(out_size),
                                 yb.end() - static_cast<std::ptrdiff_t>(out_size));

  // Reference: walk every line in index order.
  const int64_t rank = static_cast<int64_t>(c.shape.size());
  const int64_t dim = c.dim < 0 ? c.dim + rank : c.dim;
  int64_t outer = 1, len = rank == 0 ? 1 : c.shape[static_cast<size_t>(dim)], inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < dim) outer *= c.shape[static_cast<size_t>(d)];
    if (d > dim) inner *= c.shape[static_cast<size_t>(d)];
  }
  for (int64_t line = 0; line < outer * inner; ++line) {
    float facc = 0.0f;
    int64_t iacc = 0;
    for (int64_t i = 0; i < len; ++i) {
      const size_t e = static_cast<size_t>((line / inner) * len * inner + i * inner + line % inner);
      // PyTorch converts the input to the output's dtype first (floats
      // truncate toward zero into integers), then sums.
      if (is_float(c.out)) {
        facc += is_float(c.in) ? static_cast<float>(read_elem(c.in, xb, e)) : static_cast<float>(int_elem(c.in, xb, e));
        ASSERT_EQ(read_elem(c.out, got, e), round_to(c.out, facc)) << "line " << line << " element " << i;
      } else {
        iacc += is_float(c.in) ? static_cast<int64_t>(std::trunc(read_elem(c.in, xb, e))) : int_elem(c.in, xb, e);
        const int64_t want = c.out == DType::kInt32 ? static_cast<int32_t>(static_cast<uint32_t>(iacc)) : iacc;
        ASSERT_EQ(int_elem(c.out, got, e), want) << "line " << line << " element " << i;
      }
    }
  }
}

TEST(ScanKernel, CumsumMatchesTheReference) {
  // KILN_TEST_SEED=<n> replays a failure's inputs.
  const char* env = std::getenv("KILN_TEST_SEED");
  const unsigned seed = env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
  SCOPED_TRACE("KILN_TEST_SEED=" + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<ScanCase> cases = {
      // Floats: the last dim (negative and positive), a middle dim, the first.
      {"f32_last", {5, 200}, -1, DType::kFloat32, DType::kFloat32},
      {"f32_middle", {3, 70, 5}, 1, DType::kFloat32, DType::kFloat32},
      {"f16_first", {64, 3, 4}, 0, DType::kFloat16, DType::kFloat16},
      {"f16_last", {4, 130}, 1, DType::kFloat16, DType::kFloat16},
      {"bf16_middle", {2, 96, 33}, -2, DType::kBFloat16, DType::kBFloat16},
      {"bf16_last", {300, 7}, -1, DType::kBFloat16, DType::kBFloat16},
      // cumsum(x, dtype=torch.float32) of a half tensor.
      {"f16_to_f32", {6, 40}, 1, DType::kFloat16, DType::kFloat32},
      // Integers and bools: exact, into int64 (PyTorch's result) or int32.
      {"i64_last", {3, 90}, -1, DType::kInt64, DType::kInt64},
      {"i32_middle", {2, 50, 3}, 1, DType::kInt32, DType::kInt64},
      {"i32_to_i32", {4, 20}, 0, DType::kInt32, DType::kInt32},
      {"bool_positions", {2, 128}, 1, DType::kBool, DType::kInt64},
      {"bool_first", {33, 2, 2}, 0, DType::kBool, DType::kInt32},
      // cumsum(x, dtype=...) across kinds: a float mask counted into int32 (Mixtral's
      // routing), floats truncated into int64, integers and bools summed as floats.
      {"f32_to_i32", {4, 64}, 1, DType::kFloat32, DType::kInt32},
      {"bf16_to_i64", {3, 40, 2}, 1, DType::kBFloat16, DType::kInt64},
      {"i32_to_f32", {5, 30}, -1, DType::kInt32, DType::kFloat32},
      {"bool_to_f16", {2, 100}, 1, DType::kBool, DType::kFloat16},
      // More lines than one block holds: a second block.
      {"f32_many_lines", {300, 3, 2}, 1, DType::kFloat32, DType::kFloat32},
      // A 0-d tensor: one element, its own sum.
      {"scalar", {}, 0, DType::kFloat32, DType::kFloat32},
  };
  for (const ScanCase& c : cases) check_scan(c, rng);
}

// The dim rule every op shares (ops/dim_arg.h): [-rank, rank), a 0-d tensor
// taking 0 or -1 only where asked, the reason naming the op, dim and rank.
TEST(DimArg, NormalizesInRangeAndNamesTheRangeOtherwise) {
  int64_t d = 99;
  EXPECT_EQ(ops::normalize_dim(-1, 3, "softmax", &d), "");
  EXPECT_EQ(d, 2);
  EXPECT_EQ(ops::normalize_dim(2, 3, "softmax", &d), "");
  EXPECT_EQ(d, 2);
  EXPECT_EQ(ops::normalize_dim(-3, 3, "softmax", &d), "");
  EXPECT_EQ(d, 0);
  d = 99;
  EXPECT_EQ(ops::normalize_dim(3, 3, "softmax", &d), "softmax dim 3 is out of range for rank 3");
  EXPECT_EQ(ops::normalize_dim(-4, 3, "node 'cat':", &d), "node 'cat': dim -4 is out of range for rank 3");
  EXPECT_EQ(d, 99) << "a refused dim leaves the output alone";
  EXPECT_EQ(ops::normalize_dim(-1, 0, "cumsum", &d), "");  // a 0-d tensor, as a rank-1 one
  EXPECT_EQ(d, 0);
  EXPECT_EQ(ops::normalize_dim(0, 0, "select", &d, false), "select dim 0 is out of range for rank 0");
}

TEST(ScanKernel, RefusalsNameTheProblem) {
  using ops::OpQuery;
  auto why = [](DType in, DType out, int64_t dim, Shape shape = {4, 8}) {
    OpQuery q{"aten.cumsum.default", {{in, shape, false}}, {{"dim", dim}}, {{out, shape, false}}};
    return ops::check_cumsum(q);
  };
  EXPECT_EQ(why(DType::kFloat32, DType::kFloat32, 2), "cumsum dim 2 is out of range for rank 2");
  EXPECT_EQ(why(DType::kInt64, DType::kInt64, -3), "cumsum dim -3 is out of range for rank 2");
  EXPECT_TRUE(why(DType::kInt64, DType::kInt64, -2).empty());
  for (auto [in, out] : {std::pair{DType::kFloat32, DType::kBool}, std::pair{DType::kInt64, DType::kBool},
                         std::pair{DType::kBool, DType::kBool}}) {
    const std::string reason = why(in, out, 1);
    SCOPED_TRACE(reason);
    EXPECT_NE(reason.find(std::string("from ") + engine::dtype_name(in) + " to " + engine::dtype_name(out)),
              std::string::npos);
  }
  OpQuery no_dim{"aten.cumsum.default", {{DType::kFloat32, {4}, false}}, {}, {{DType::kFloat32, {4}, false}}};
  EXPECT_EQ(ops::check_cumsum(no_dim), "cumsum needs an integer dim");

  // The compiler's own query (the partitioner's): the registry's check runs.
  compiler::OpQuery bad{"aten.cumsum.default", {{DType::kFloat32, {4, 8}, false}}, {{"dim", int64_t{5}}},
                        {{DType::kFloat32, {4, 8}, false}}};
  auto reason = compiler::check_support(bad);
  ASSERT_TRUE(reason.has_value());
  EXPECT_NE(reason->find("dim 5"), std::string::npos) << *reason;

  // A graph that bypasses the check fails planning naming the node.
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {4, 8});
  const int node = g.add_node("aten.cumsum.default", "my_cumsum", {x}, {{"dim", int64_t{7}}},
                              {{DType::kFloat32, {4, 8}}});
  g.set_outputs({out0(g, node)});
  try {
    compiler::compile_to_desc(g, {});
    FAIL() << "cumsum over dim 7 of a 2-d tensor compiled";
  } catch (const CompileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("my_cumsum"), std::string::npos) << what;
    EXPECT_NE(what.find("dim 7"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace kiln
