// Pointwise kernels in both of their forms, no GPU needed (cuda_host_shim.h,
// thread by thread): the vector form (16 bytes of every full-shape or
// row-broadcast operand a thread) when the buffers are 16-byte aligned, and
// the scalar loop when one is not or when the sizes do not allow vectors.
// Fresh random data; the reference is the same chain in double, rounded to
// the output dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/elementwise_kernel.h"
#include "passes/passes.h"

#ifndef KILN_SHIM_HEADER
#error "KILN_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using Shape = std::vector<int64_t>;
struct alignas(16) Chunk {
  unsigned char bytes[16];
};

struct Case {
  DType dtype;
  Shape shape;       // x's and the output's
  bool vector_form;  // whether the kernel should have one
};

// out = gelu(x + bias) * x - s, bias a row broadcast over x's leading dims,
// s a one-element tensor; run with the output at `out_shift` elements past an
// aligned address (1: the scalar loop must take over).
void check(const Case& c, size_t out_shift) {
  ir::Graph g;
  const Shape row{c.shape.back()};
  int x = g.add_input("x", c.dtype, c.shape), bias = g.add_input("bias", c.dtype, row);
  int s = g.add_input("s", c.dtype, {1});
  auto node = [&](const std::string& op, std::vector<int> in, std::map<std::string, ir::Attr> attrs) {
    int n = g.add_node(op, op + std::to_string(g.nodes().size()), std::move(in), std::move(attrs), {{c.dtype, c.shape}});
    return g.nodes()[static_cast<size_t>(n)].outputs[0];
  };
  int added = node("aten.add.Tensor", {x, bias}, {});
  int act = node("aten.gelu.default", {added}, {{"approximate", std::string("none")}});
  int prod = node("aten.mul.Tensor", {act, x}, {});
  int out = node("aten.sub.Tensor", {prod, s}, {});
  g.set_outputs({out});
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u);
  const ops::PointwisePlan* p = plan.ops[0].as<ops::PointwisePlan>();
  ASSERT_NE(p, nullptr);
  const std::string src = ops::generate_pointwise_kernel(g, *p, "kiln_pw_test");
  EXPECT_EQ(src.find("uint4") != std::string::npos, c.vector_form) << src;

  const size_t es = engine::dtype_size(c.dtype), n = static_cast<size_t>(ir::numel_of(c.shape));
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.5f);
  // 16-byte aligned storage; the output may start `out_shift` elements in.
  auto buffer = [&](size_t count) { return std::vector<Chunk>((count * es + 64) / 16 + 1); };
  std::vector<Chunk> xs = buffer(n), bs = buffer(row[0]), ss = buffer(1), os = buffer(n + 1);
  std::vector<uint8_t> xb(n * es), bb(static_cast<size_t>(row[0]) * es), sb(es);
  for (size_t i = 0; i < n; ++i) testing::write_elem(c.dtype, xb, i, normal(rng));
  for (size_t i = 0; i < static_cast<size_t>(row[0]); ++i) testing::write_elem(c.dtype, bb, i, normal(rng));
  testing::write_elem(c.dtype, sb, 0, normal(rng));
  std::memcpy(xs.data(), xb.data(), xb.size());
  std::memcpy(bs.data(), bb.data(), bb.size());
  std::memcpy(ss.data(), sb.data(), sb.size());
  void* optr = reinterpret_cast<uint8_t*>(os.data()) + out_shift * es;
  // Inputs in the plan's order.
  std::map<int, void*> by_value{{x, xs.data()}, {bias, bs.data()}, {s, ss.data()}};
  std::vector<void*> ptrs{optr};
  for (int in : p->inputs) ptrs.push_back(by_value.at(in));
  long long count = static_cast<long long>(n);
  std::vector<void*> args;
  for (void*& q : ptrs) args.push_back(&q);
  args.push_back(&count);
  testing::run_host_kernel(src, "kiln_pw_test", "pointwise", args.data(), 2, ops::kPointwiseBlock, KILN_SHIM_HEADER);

  std::vector<uint8_t> result(n * es);
  std::memcpy(result.data(), optr, result.size());
  const size_t cols = static_cast<size_t>(row[0]);
  for (size_t i = 0; i < n; ++i) {
    const double xv = testing::read_elem(c.dtype, xb, i), bv = testing::read_elem(c.dtype, bb, i % cols);
    const double sv = testing::read_elem(c.dtype, sb, 0);
    const double a = xv + bv, gelu = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
    const double want = testing::round_to(c.dtype, gelu * xv - sv);
    const double got = testing::read_elem(c.dtype, result, i);
    // float32 math inside the kernel: a few float ulps, then one rounding.
    const double tol = (c.dtype == DType::kFloat32 ? 4e-6 : 1e-2) * (std::fabs(want) + 1.0);
    ASSERT_NEAR(got, want, tol) << "element " << i << " of " << n << ", output shifted " << out_shift;
  }
}

TEST(PointwiseKernel, Float16VectorFormAndUnalignedFallback) {
  check({DType::kFloat16, {16, 64}, true}, 0);
  check({DType::kFloat16, {16, 64}, true}, 1);
}

TEST(PointwiseKernel, BFloat16AndFloat32VectorForm) {
  check({DType::kBFloat16, {4, 3, 40}, true}, 0);
  check({DType::kFloat32, {8, 36}, true}, 0);
  check({DType::kFloat32, {8, 36}, true}, 3);
}

TEST(PointwiseKernel, ScalarFormWhenSizesDoNotDivide) {
  check({DType::kFloat16, {7, 9}, false}, 0);
  check({DType::kFloat32, {5, 6}, false}, 1);  // 30 elements: under 16 vectors
}

}  // namespace
}  // namespace kiln
