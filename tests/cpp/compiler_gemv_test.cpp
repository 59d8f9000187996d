// The matrix-vector kernel of a language model's decode step (ops/gemv_kernel.h),
// no GPU needed: when planning picks it over cuBLASLt, and its numerics (bias,
// residual addend, ReLU; the RMSNorm prologue; the paired gate|up product with
// its SiLU * up epilogue) against references computed here on fresh random
// inputs, each kernel compiled as host C++ through cuda_block_shim.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "codegen/grid_dependency.h"
#include "codegen/nvrtc_compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/elementwise_kernel.h"
#include "ops/gemv_kernel.h"
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

std::vector<uint8_t> random_bytes(DType d, int64_t count, std::mt19937& rng) {
  return testing::random_elems(d, count, rng, -3.0f, 3.0f);
}
using testing::out0;
using testing::count_of;
using testing::slice_last;
using testing::TestLowerContext;

using testing::BlockLaunch;
BlockLaunch block_launcher(const std::string& source, const std::string& fn, const std::string& tag) {
  return testing::block_launcher(source, fn, tag, KILN_BLOCK_SHIM_HEADER);
}

// ---- matrix-vector products ---------------------------------------------------

// With overlap_launches a product whose weight is a constant issues its first
// weight loads above its grid-dependency wait (codegen/grid_dependency.h); a
// weight that a kernel computes, or classic launches, keep every load below.
TEST(DecodeOps, FirstWeightLoadsPrecedeTheWaitOnlyForConstantWeights) {
  for (bool constant : {true, false})
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(std::string(constant ? "constant" : "computed") + " weight, overlap " + (overlap ? "on" : "off"));
      ir::Graph g;
      const int x = g.add_input("x", DType::kFloat16, {1, 256});
      const int w = constant ? g.add_constant("w", DType::kFloat16, {64, 256},
                                              std::vector<uint8_t>(static_cast<size_t>(64 * 256 * 2)))
                             : out0(g, g.add_node("aten.relu.default", "relu", {g.add_input("v", DType::kFloat16,
                                                                                                {64, 256})},
                                                  {}, {{DType::kFloat16, {64, 256}}}));
      const int y = out0(g, g.add_node("aten.linear.default", "linear", {x, w}, {}, {{DType::kFloat16, {1, 64}}}));
      g.set_outputs({y});
      ops::OpOptions options;
      options.overlap_launches = overlap;
      passes::ExecPlan plan = passes::fuse(g, options);
      const ops::GemmPlan* gemm = nullptr;
      for (const auto& op : plan.ops)
        if (op.as<ops::GemmPlan>() != nullptr) gemm = op.as<ops::GemmPlan>();
      ASSERT_NE(gemm, nullptr);
      ASSERT_TRUE(gemm->gemv);
      EXPECT_EQ(gemm->early_weights, constant && overlap);
      TestLowerContext ctx(g);
      for (const auto& op : plan.ops) {
        engine::Step step;
        op.plan->lower(ctx, step);
      }
      EXPECT_EQ(count_of(ctx.source(), codegen::kGridDependencyWaitMarker), constant && overlap ? 1u : 0u);
    }
}

// A linear over a few rows of activations plans a generated kernel when
// gemv_kernels is on (and cuBLASLt when off, or when the rows are many).
TEST(DecodeOps, SmallProductsPlanTheGemvKernel) {
  for (int64_t rows : {int64_t{1}, int64_t{4}, int64_t{5}})
    for (bool on : {true, false}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + (on ? " gemv on" : " gemv off"));
      ir::Graph g;
      const int x = g.add_input("x", DType::kFloat16, {rows, 256});
      std::vector<uint8_t> wb(static_cast<size_t>(64 * 256 * 2));
      const int w = g.add_constant("w", DType::kFloat16, {64, 256}, std::move(wb));
      const int y = out0(g, g.add_node("aten.linear.default", "linear", {x, w}, {}, {{DType::kFloat16, {rows, 64}}}));
      g.set_outputs({y});
      ops::OpOptions options;
      options.gemv_kernels = on;
      passes::ExecPlan plan = passes::fuse(g, options);
      ASSERT_EQ(plan.ops.size(), 1u);
      TestLowerContext ctx(g);
      engine::Step step;
      plan.ops[0].plan->lower(ctx, step);
      const bool want_kernel = on && rows <= ops::kGemvMaxRows;
      EXPECT_EQ(step.kind, want_kernel ? engine::StepKind::kKernel : engine::StepKind::kGemm);
      if (want_kernel) {
        EXPECT_NE(ctx.source().find("gemv"), std::string::npos);
      }
    }
}

// NVRTC and the grid-dependency patch keep the order the source gives: in the
// sm_90 PTX a product's first weight loads come before its wait, the trigger
// before both; the PTX kept for JIT has neither instruction, only the marker.
TEST(DecodeOps, EarlyWeightLoadsAssembleAboveTheWait) {
  ops::GemmPlan p;
  p.a = 0;
  p.b = 1;
  p.out = 2;
  p.b_transposed = true;
  p.m = 1;
  p.n = 64;
  p.k = 1024;
  p.early_weights = true;
  const ops::GemvKernel gen = ops::generate_gemv_kernel(p, DType::kBFloat16, "kiln_gemv_early");
  const engine::KernelModule module =
      codegen::compile_module("m", ops::pointwise_prelude() + gen.source, {80, 90}, true, {}, true);
  ASSERT_EQ(module.cubins.size(), 2u);
  EXPECT_EQ(count_of(module.ptx, "griddepcontrol"), 0u);
  EXPECT_EQ(count_of(module.ptx, codegen::kGridDependencyWaitMarker), 1u);
  const std::string patched = codegen::add_grid_dependency(module.ptx);
  EXPECT_EQ(count_of(patched, codegen::kGridDependencyWaitMarker), 0u);
  ASSERT_EQ(count_of(patched, "griddepcontrol.wait;"), 1u);
  const size_t trigger = patched.find("griddepcontrol.launch_dependents;");
  const size_t load = patched.find("ld.global.nc");
  const size_t wait = patched.find("griddepcontrol.wait;");
  ASSERT_NE(trigger, std::string::npos);
  ASSERT_NE(load, std::string::npos);
  EXPECT_LT(trigger, load);
  EXPECT_LT(load, wait) << "the first weight load is issued before the wait";
}

// The kernel against a double reference: rows x [k] . [n, k]^T + bias + C,
// ReLU, in every dtype, k a multiple of the 16-byte vector with and without a
// partial last chunk of lanes.
TEST(DecodeOps, GemvKernelMatchesReference) {
  std::mt19937 rng(std::random_device{}());
  struct Case {
    DType dt;
    int64_t m, n, k;
    bool bias, c, relu;
    bool wide;  // the shape with four columns a warp and rows split over four warps (256 threads)
  };
  int case_index = 0;
  for (const Case& c : {Case{DType::kFloat32, 1, 37, 200, true, false, false, false},
                        Case{DType::kFloat16, 2, 64, 1024, false, true, false, true},
                        Case{DType::kBFloat16, 1, 9, 4096 + 8 * 40, false, false, false, true},
                        Case{DType::kBFloat16, 1, 16, 128, false, false, false, false},
                        Case{DType::kBFloat16, 4, 16, 256, true, false, true, false},
                        Case{DType::kFloat32, 3, 5, 64 * 8 + 4 * 17, true, true, false, false},
                        // wide: a last block with 5 of its 8 columns, a slice of 48 vectors
                        // (a lane's second group half empty), every epilogue term
                        Case{DType::kFloat32, 3, 13, 768, true, true, false, true},
                        Case{DType::kBFloat16, 4, 20, 2048, true, false, true, true},
                        Case{DType::kBFloat16, 1, 1024, 4096, false, true, false, true},
                        // more columns than the wide shape takes
                        Case{DType::kFloat16, 1, 2056, 1024, false, true, false, false}})
  for (bool early : {false, true}) {
    SCOPED_TRACE(std::string(engine::dtype_name(c.dt)) + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) +
                 " k " + std::to_string(c.k) + (early ? " early weights" : ""));
    ops::GemmPlan p;
    p.a = 0;
    p.b = 1;
    p.out = 2;
    p.bias = c.bias ? 3 : -1;
    p.c = c.c ? 4 : -1;
    p.beta = c.c ? 1.0f : 0.0f;
    p.b_transposed = true;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    p.epilogue = c.relu ? (c.bias ? engine::GemmEpilogue::kReluBias : engine::GemmEpilogue::kRelu)
                        : (c.bias ? engine::GemmEpilogue::kBias : engine::GemmEpilogue::kNone);
    p.early_weights = early;
    ASSERT_TRUE(ops::gemv_applies(p, c.dt));
    const std::string fn = "kiln_gemv_test_" + std::to_string(case_index++);
    const ops::GemvKernel gen = ops::generate_gemv_kernel(p, c.dt, fn);
    EXPECT_EQ(gen.block == 256, c.wide);
    EXPECT_EQ(count_of(gen.source, codegen::kGridDependencyWaitMarker), early ? 1u : 0u);
    const BlockLaunch launch = block_launcher(gen.source, fn, fn);
    ASSERT_NE(launch, nullptr);
    std::vector<uint8_t> x = random_bytes(c.dt, c.m * c.k, rng), w = random_bytes(c.dt, c.n * c.k, rng),
                         bias = random_bytes(c.dt, c.n, rng), addend = random_bytes(c.dt, c.m * c.n, rng),
                         out(static_cast<size_t>(c.m * c.n) * engine::dtype_size(c.dt));
    std::vector<void*> ptr = {out.data(), x.data(), w.data()};
    if (c.bias) ptr.push_back(bias.data());
    if (c.c) ptr.push_back(addend.data());
    std::vector<void*> args;
    for (void*& q : ptr) args.push_back(&q);
    launch(args.data(), gen.grid, gen.block);
    // Products of k terms of magnitude <= 9 in fp32: the reference's scale.
    const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = 0; j < c.n; ++j) {
        double want = 0, scale = 0;
        for (int64_t e = 0; e < c.k; ++e) {
          const double t = read_elem(c.dt, x, static_cast<size_t>(r * c.k + e)) *
                           read_elem(c.dt, w, static_cast<size_t>(j * c.k + e));
          want += t;
          scale += std::fabs(t);
        }
        if (c.bias) want += read_elem(c.dt, bias, static_cast<size_t>(j));
        if (c.c) want += read_elem(c.dt, addend, static_cast<size_t>(r * c.n + j));
        if (c.relu) want = std::max(want, 0.0);
        want = round_to(c.dt, want);
        const double got = read_elem(c.dt, out, static_cast<size_t>(r * c.n + j));
        ASSERT_NEAR(got, want, tol * (1.0 + std::fabs(want)) + 1e-6 * scale) << "row " << r << " column " << j;
      }
  }
}

// HF Llama's RMSNorm ([cast] pow, mean, add eps, rsqrt, mul, [cast], mul by
// the weight) feeding a linear over a decode step's rows: one matrix-vector
// kernel that normalizes its rows itself (GemmPlan::rms_norm). A second
// reader of the norm, or more rows than the kernel takes, keeps the norm's
// own kernel.
struct NormLinearCase {
  DType dt;
  int64_t m, n, k;
  bool bias, casts, norm_weight, extra_reader;
};

void check_norm_linear(const NormLinearCase& c, int index, std::mt19937& rng) {
  SCOPED_TRACE(std::string(engine::dtype_name(c.dt)) + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) +
               " k " + std::to_string(c.k) + (c.extra_reader ? " extra reader" : ""));
  ir::Graph g;
  const Shape xs{1, c.m, c.k}, kept{1, c.m, 1}, ys{1, c.m, c.n};
  const double eps = 1e-6;
  const int x = g.add_input("x", c.dt, xs);
  const DType f = c.casts ? DType::kFloat32 : c.dt;
  const int a = c.casts ? out0(g, g.add_node("aten._to_copy.default", "up", {x}, {}, {{f, xs}})) : x;
  const int sq = out0(g, g.add_node("aten.pow.Tensor_Scalar", "sq", {a}, {{"exponent", int64_t{2}}}, {{f, xs}}));
  const int mean = out0(g, g.add_node("aten.mean.dim", "mean", {sq},
                                      {{"dim", std::vector<int64_t>{-1}}, {"keepdim", true}}, {{f, kept}}));
  const int add = out0(g, g.add_node("aten.add.Scalar", "add", {mean}, {{"other", eps}}, {{f, kept}}));
  const int r = out0(g, g.add_node("aten.rsqrt.default", "rsqrt", {add}, {}, {{f, kept}}));
  int y = out0(g, g.add_node("aten.mul.Tensor", "mul", {a, r}, {}, {{f, xs}}));
  if (c.casts) y = out0(g, g.add_node("aten._to_copy.default", "down", {y}, {}, {{c.dt, xs}}));
  std::uniform_real_distribution<float> pos(0.5f, 1.5f);
  std::vector<uint8_t> gamma(static_cast<size_t>(c.k) * engine::dtype_size(c.dt));
  for (int64_t e = 0; e < c.k; ++e) write_elem(c.dt, gamma, static_cast<size_t>(e), pos(rng));
  if (c.norm_weight) {
    const int gw = g.add_constant("norm_weight", c.dt, {c.k}, gamma);
    y = out0(g, g.add_node("aten.mul.Tensor", "scale", {gw, y}, {}, {{c.dt, xs}}));
  }
  const std::vector<uint8_t> w = random_bytes(c.dt, c.n * c.k, rng), bias = random_bytes(c.dt, c.n, rng);
  std::vector<int> operands{y, g.add_constant("w", c.dt, {c.n, c.k}, w)};
  if (c.bias) operands.push_back(g.add_constant("b", c.dt, {c.n}, bias));
  const int out = out0(g, g.add_node("aten.linear.default", "proj", operands, {}, {{c.dt, ys}}));
  std::vector<int> outputs{out};
  if (c.extra_reader) outputs.push_back(out0(g, g.add_node("aten.relu.default", "relu", {y}, {}, {{c.dt, xs}})));
  g.set_outputs(outputs);
  ops::OpOptions options;
  options.gemv_kernels = true;
  options.overlap_launches = index % 2 == 1;  // odd cases: first weight loads above the wait
  passes::ExecPlan plan = passes::fuse(g, options);
  const bool fused = !c.extra_reader && c.m <= ops::kGemvMaxRows;
  const ops::GemmPlan* gemm = nullptr;
  for (const auto& op : plan.ops)
    if (op.as<ops::GemmPlan>() != nullptr) gemm = op.as<ops::GemmPlan>();
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->rms_norm, fused);
  if (!fused) {
    EXPECT_GE(plan.ops.size(), 2u) << "the norm keeps its kernel";
    return;
  }
  ASSERT_EQ(plan.ops.size(), 1u) << "norm and product are one kernel";
  EXPECT_EQ(plan.ops[0].label, "rms_norm+linear");
  EXPECT_EQ(gemm->a, x);
  TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  ASSERT_EQ(step.kind, engine::StepKind::kKernel);
  EXPECT_EQ(count_of(ctx.source(), codegen::kGridDependencyWaitMarker), options.overlap_launches ? 1u : 0u);
  const BlockLaunch launch = block_launcher(ctx.source(), step.kernel.function, "norm_gemv_" + std::to_string(index));
  ASSERT_NE(launch, nullptr);
  std::vector<uint8_t> xb = random_bytes(c.dt, c.m * c.k, rng);
  std::vector<uint8_t> ob(static_cast<size_t>(c.m * c.n) * engine::dtype_size(c.dt));
  std::vector<const void*> ptr = {ob.data(), xb.data(), w.data()};
  if (c.bias) ptr.push_back(bias.data());
  if (c.norm_weight) ptr.push_back(gamma.data());
  ASSERT_EQ(step.kernel.args.size(), ptr.size());
  std::vector<void*> args;
  for (const void*& q : ptr) args.push_back(&q);
  launch(args.data(), step.kernel.grid[0], step.kernel.block[0]);
  // Reference: the kernel's order, the norm's output kept unrounded (PyTorch
  // rounds it to the dtype first; that differs by up to half an ulp per term,
  // which over k random terms is not a bound a test can hold). What is left:
  // the output's rounding and fp32 accumulation over k terms.
  const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 1e-3 : 8e-3;
  for (int64_t row = 0; row < c.m; ++row) {
    double ss = 0;
    for (int64_t e = 0; e < c.k; ++e) ss += std::pow(read_elem(c.dt, xb, static_cast<size_t>(row * c.k + e)), 2);
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(c.k) + eps);
    for (int64_t j = 0; j < c.n; ++j) {
      double want = 0, scale = 0;
      for (int64_t e = 0; e < c.k; ++e) {
        double yn = read_elem(c.dt, xb, static_cast<size_t>(row * c.k + e)) * rs;
        if (c.norm_weight) yn *= read_elem(c.dt, gamma, static_cast<size_t>(e));
        const double t = yn * read_elem(c.dt, w, static_cast<size_t>(j * c.k + e));
        want += t;
        scale += std::fabs(t);
      }
      if (c.bias) want += read_elem(c.dt, bias, static_cast<size_t>(j));
      want = round_to(c.dt, want);
      const double got = read_elem(c.dt, ob, static_cast<size_t>(row * c.n + j));
      ASSERT_NEAR(got, want, tol * (1.0 + std::fabs(want)) + 1e-6 * scale) << "row " << row << " column " << j;
    }
  }
}

// A merged gate|up product read only by SiLU(gate) * up (as its last-dim
// halves): one matrix-vector kernel computing both columns of a pair and the
// elementwise epilogue (passes/gemv_pair_epilogue.cpp). Another reader of
// the product keeps the two kernels.
struct PairCase {
  DType dt;
  int64_t m, inter, k;
  bool bias, extra_reader;
};

void check_gemv_pair(const PairCase& c, int index, std::mt19937& rng) {
  SCOPED_TRACE(std::string(engine::dtype_name(c.dt)) + " m " + std::to_string(c.m) + " inter " +
               std::to_string(c.inter) + " k " + std::to_string(c.k) + (c.extra_reader ? " extra reader" : ""));
  ir::Graph g;
  const int64_t n = 2 * c.inter;
  const Shape xs{1, c.m, c.k}, gs{1, c.m, n}, hs{1, c.m, c.inter};
  const int x = g.add_input("x", c.dt, xs);
  const std::vector<uint8_t> w = random_bytes(c.dt, n * c.k, rng), bias = random_bytes(c.dt, n, rng);
  std::vector<int> operands{x, g.add_constant("w", c.dt, {n, c.k}, w)};
  if (c.bias) operands.push_back(g.add_constant("b", c.dt, {n}, bias));
  const int gu = out0(g, g.add_node("aten.linear.default", "gate_up", operands, {}, {{c.dt, gs}}));
  const int gate = slice_last(g, gu, 0, c.inter), up = slice_last(g, gu, c.inter, n);
  const int sg = out0(g, g.add_node("aten.sigmoid.default", "sigmoid", {gate}, {}, {{c.dt, hs}}));
  const int act = out0(g, g.add_node("aten.mul.Tensor", "silu", {gate, sg}, {}, {{c.dt, hs}}));
  std::vector<int> outputs{out0(g, g.add_node("aten.mul.Tensor", "mul", {act, up}, {}, {{c.dt, hs}}))};
  if (c.extra_reader) outputs.push_back(out0(g, g.add_node("aten.relu.default", "relu", {gu}, {}, {{c.dt, gs}})));
  g.set_outputs(outputs);
  ops::OpOptions options;
  options.gemv_kernels = true;
  options.overlap_launches = index % 2 == 0;  // even cases: first weight loads above the wait
  passes::ExecPlan plan = passes::fuse(g, options);
  passes::plan_gemv_pair_epilogues(g, plan);
  const ops::GemmPlan* gemm = nullptr;
  for (const auto& op : plan.ops)
    if (op.as<ops::GemmPlan>() != nullptr) gemm = op.as<ops::GemmPlan>();
  ASSERT_NE(gemm, nullptr);
  ASSERT_TRUE(gemm->gemv);
  EXPECT_EQ(gemm->paired, !c.extra_reader);
  if (c.extra_reader) {
    EXPECT_GE(plan.ops.size(), 2u);
    return;
  }
  ASSERT_EQ(plan.ops.size(), 1u) << "product and SiLU*up are one kernel";
  EXPECT_EQ(plan.ops[0].label, "linear+sigmoid+mul+mul");
  TestLowerContext ctx(g);
  engine::Step step;
  plan.ops[0].plan->lower(ctx, step);
  ASSERT_EQ(step.kind, engine::StepKind::kKernel);
  EXPECT_EQ(step.kernel.args[0].tensor, static_cast<uint32_t>(gemm->out));
  EXPECT_EQ(count_of(ctx.source(), codegen::kGridDependencyWaitMarker), options.overlap_launches ? 1u : 0u);
  const BlockLaunch launch = block_launcher(ctx.source(), step.kernel.function, "gemv_pair_" + std::to_string(index));
  ASSERT_NE(launch, nullptr);
  std::vector<uint8_t> xb = random_bytes(c.dt, c.m * c.k, rng);
  std::vector<uint8_t> ob(static_cast<size_t>(c.m * c.inter) * engine::dtype_size(c.dt) + 64, 0x5a);
  std::vector<const void*> ptr = {ob.data(), xb.data(), w.data()};
  if (c.bias) ptr.push_back(bias.data());
  ASSERT_EQ(step.kernel.args.size(), ptr.size());
  std::vector<void*> args;
  for (const void*& q : ptr) args.push_back(&q);
  launch(args.data(), step.kernel.grid[0], step.kernel.block[0]);
  const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
  auto product = [&](int64_t row, int64_t col, double* scale) {
    double sum = c.bias ? read_elem(c.dt, bias, static_cast<size_t>(col)) : 0.0;
    for (int64_t e = 0; e < c.k; ++e) {
      const double t = read_elem(c.dt, xb, static_cast<size_t>(row * c.k + e)) *
                       read_elem(c.dt, w, static_cast<size_t>(col * c.k + e));
      sum += t;
      *scale += std::fabs(t);
    }
    return round_to(c.dt, sum);  // as the product's dtype stores it
  };
  for (int64_t row = 0; row < c.m; ++row)
    for (int64_t j = 0; j < c.inter; ++j) {
      double scale = 0;
      const double a = product(row, j, &scale), b = product(row, c.inter + j, &scale);
      const double sig = round_to(c.dt, 1.0 / (1.0 + std::exp(-a)));
      const double want = round_to(c.dt, round_to(c.dt, a * sig) * b);
      const double got = read_elem(c.dt, ob, static_cast<size_t>(row * c.inter + j));
      ASSERT_NEAR(got, want, tol * (1.0 + std::fabs(want)) + 1e-6 * scale * (1.0 + std::fabs(b)))
          << "row " << row << " column " << j;
    }
  for (size_t i = static_cast<size_t>(c.m * c.inter) * engine::dtype_size(c.dt); i < ob.size(); ++i)
    ASSERT_EQ(ob[i], 0x5a) << "wrote past the output";
}

TEST(DecodeOps, GateUpProductComputesSiluTimesUp) {
  std::mt19937 rng(std::random_device{}());
  int index = 0;
  for (const PairCase& c : {PairCase{DType::kFloat32, 1, 40, 256, true, false},
                            PairCase{DType::kBFloat16, 1, 24, 512, false, false},
                            PairCase{DType::kFloat16, 3, 16, 256, true, false},
                            PairCase{DType::kFloat32, 1, 40, 256, false, true},
                            // Several chunks of weight loads a row (k > 32 lanes x 8 vectors).
                            PairCase{DType::kBFloat16, 2, 8, 2048 + 8 * 37, true, false}})
    check_gemv_pair(c, index++, rng);
}

TEST(DecodeOps, RmsNormIsTheMatrixVectorKernelsPrologue) {
  std::mt19937 rng(std::random_device{}());
  int index = 0;
  for (const NormLinearCase& c : {NormLinearCase{DType::kFloat32, 1, 24, 256, true, false, true, false},
                                  NormLinearCase{DType::kBFloat16, 1, 40, 1024, false, true, true, false},
                                  NormLinearCase{DType::kFloat16, 3, 17, 512, true, true, false, false},
                                  NormLinearCase{DType::kFloat32, 2, 8, 128, false, false, true, true},
                                  NormLinearCase{DType::kFloat32, 6, 8, 128, false, false, true, false},
                                  NormLinearCase{DType::kBFloat16, 1, 12, 4096 + 8 * 5, false, false, true, false}})
    check_norm_linear(c, index++, rng);
}

}  // namespace
}  // namespace kiln
