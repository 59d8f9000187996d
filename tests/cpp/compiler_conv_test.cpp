// Convolution stacks through the compiler (no GPU): batch norm folding checked
// numerically against a naive reference conv, channels-last permute
// cancellation, 1x1 convolutions as GEMMs, conv epilogue fusion, pooling
// shape rules and capability refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "ops/pool_ops.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using engine::DType;
using testing::count_kind;
using testing::count_label;

std::vector<float> floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Naive NCHW conv: x [n,c,h,w], w [k,c/g,r,s], optional bias.
std::vector<float> ref_conv(const std::vector<float>& x, std::vector<int64_t> xs, const std::vector<float>& w,
                            std::vector<int64_t> ws, const std::vector<float>* bias, int64_t stride, int64_t pad,
                            int64_t groups, int64_t& p_out, int64_t& q_out) {
  int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], k = ws[0], cg = ws[1], r = ws[2], s = ws[3];
  int64_t p = (h + 2 * pad - r) / stride + 1, q = (wd + 2 * pad - s) / stride + 1;
  p_out = p;
  q_out = q;
  std::vector<float> y(static_cast<size_t>(n * k * p * q));
  int64_t kg = k / groups;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < k; ++o)
      for (int64_t i = 0; i < p; ++i)
        for (int64_t j = 0; j < q; ++j) {
          double acc = bias ? (*bias)[static_cast<size_t>(o)] : 0.0;
          int64_t g = o / kg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t u = 0; u < r; ++u)
              for (int64_t v = 0; v < s; ++v) {
                int64_t hh = i * stride - pad + u, ww = j * stride - pad + v;
                if (hh < 0 || hh >= h || ww < 0 || ww >= wd) continue;
                acc += static_cast<double>(x[static_cast<size_t>(((b * c + g * cg + ci) * h + hh) * wd + ww)]) *
                       w[static_cast<size_t>(((o * cg + ci) * r + u) * s + v)];
              }
          y[static_cast<size_t>(((b * k + o) * p + i) * q + j)] = static_cast<float>(acc);
        }
  (void)c;
  return y;
}

int add1(ir::Graph& g, const std::string& op, const std::string& name, std::vector<int> in,
         std::map<std::string, ir::Attr> attrs, std::vector<int64_t> shape) {
  int n = g.add_node(op, name, std::move(in), std::move(attrs), {{DType::kFloat32, std::move(shape)}});
  return g.nodes()[static_cast<size_t>(n)].outputs[0];
}

std::map<std::string, ir::Attr> conv_attrs(int64_t stride, int64_t pad, int64_t groups = 1) {
  return {{"stride", std::vector<int64_t>{stride, stride}},
          {"padding", std::vector<int64_t>{pad, pad}},
          {"dilation", std::vector<int64_t>{1, 1}},
          {"transposed", false},
          {"output_padding", std::vector<int64_t>{0, 0}},
          {"groups", groups}};
}

int add_bn(ir::Graph& g, int x, int64_t k, std::vector<int64_t> shape, std::mt19937& rng, const std::string& name) {
  std::uniform_real_distribution<float> pos(0.5f, 2.0f);
  std::vector<float> var(static_cast<size_t>(k));
  for (float& v : var) v = pos(rng);
  std::vector<uint8_t> var_bytes(var.size() * 4);
  std::memcpy(var_bytes.data(), var.data(), var_bytes.size());
  int gamma = g.add_constant(name + "_w", DType::kFloat32, {k}, testing::random_float_bytes(static_cast<size_t>(k), rng));
  int beta = g.add_constant(name + "_b", DType::kFloat32, {k}, testing::random_float_bytes(static_cast<size_t>(k), rng));
  int mean = g.add_constant(name + "_m", DType::kFloat32, {k}, testing::random_float_bytes(static_cast<size_t>(k), rng));
  int v = g.add_constant(name + "_v", DType::kFloat32, {k}, var_bytes);
  int n = g.add_node("aten._native_batch_norm_legit_no_training.default", name, {x, gamma, beta, mean, v},
                     {{"momentum", 0.1}, {"eps", 1e-5}},
                     {{DType::kFloat32, shape}, {DType::kFloat32, {0}}, {DType::kFloat32, {0}}});
  return g.nodes()[static_cast<size_t>(n)].outputs[0];
}

class ConvCompiler : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(ConvCompiler, BatchNormFoldsIntoConvNumerically) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t n = 2, c = 4, h = 7, w = 6, k = 6, groups = 2;
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {n, c, h, w});
  int wt = g.add_constant("w", DType::kFloat32, {k, c / groups, 3, 3},
                          testing::random_float_bytes(static_cast<size_t>(k * c / groups * 9), rng_));
  int y = add1(g, "aten.convolution.default", "conv", {x, wt}, conv_attrs(2, 1, groups), {n, k, 4, 3});
  int z = add_bn(g, y, k, {n, k, 4, 3}, rng_, "bn");
  g.set_outputs({z});

  ir::Graph folded = passes::fold_batch_norm(g);
  ASSERT_EQ(folded.nodes().size(), 1u) << folded.describe();
  const ir::Node& conv = folded.nodes()[0];
  ASSERT_EQ(conv.inputs.size(), 3u);
  EXPECT_EQ(folded.outputs()[0], conv.outputs[0]);

  std::vector<float> xin = floats(testing::random_float_bytes(static_cast<size_t>(n * c * h * w), rng_));
  int64_t p = 0, q = 0;
  // Reference: conv, then batch norm in double.
  std::vector<float> ref = ref_conv(xin, {n, c, h, w}, floats(g.value(wt).data), {k, c / groups, 3, 3}, nullptr, 2, 1,
                                    groups, p, q);
  const ir::Node& bn = g.nodes()[1];
  auto param = [&](int i) { return floats(g.value(bn.inputs[static_cast<size_t>(i)]).data); };
  std::vector<float> gamma = param(1), beta = param(2), mean = param(3), var = param(4);
  for (size_t i = 0; i < ref.size(); ++i) {
    size_t ch = (i / static_cast<size_t>(p * q)) % static_cast<size_t>(k);
    ref[i] = static_cast<float>((ref[i] - mean[ch]) / std::sqrt(static_cast<double>(var[ch]) + 1e-5) * gamma[ch] +
                                beta[ch]);
  }
  std::vector<float> fb = floats(folded.value(conv.inputs[2]).data);
  std::vector<float> got = ref_conv(xin, {n, c, h, w}, floats(folded.value(conv.inputs[1]).data),
                                    {k, c / groups, 3, 3}, &fb, 2, 1, groups, p, q);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
}

TEST_F(ConvCompiler, BatchNormWithoutConvBecomesMultiplyAdd) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {2, 3, 5, 5});
  int z = add_bn(g, x, 3, {2, 3, 5, 5}, rng_, "bn");
  g.set_outputs({z});
  ir::Graph out = passes::fold_batch_norm(g);
  ASSERT_EQ(out.nodes().size(), 2u);
  EXPECT_EQ(out.nodes()[0].op, "aten.mul.Tensor");
  EXPECT_EQ(out.nodes()[1].op, "aten.add.Tensor");
  EXPECT_EQ(out.value(out.nodes()[0].inputs[1]).shape, (std::vector<int64_t>{3, 1, 1}));
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(d.steps.size(), 1u) << "mul and add fuse into one kernel";
}

// conv -> relu -> conv -> relu: the only layout kernels are the two engine
// edges (NCHW input -> NHWC, NHWC -> NCHW output).
TEST_F(ConvCompiler, PermutesCancelInsideAConvStack) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {1, 8, 16, 16});
  int w1 = g.add_constant("w1", DType::kFloat32, {16, 8, 3, 3}, testing::random_float_bytes(16 * 8 * 9, rng_));
  int w2 = g.add_constant("w2", DType::kFloat32, {16, 16, 3, 3}, testing::random_float_bytes(16 * 16 * 9, rng_));
  int y = add1(g, "aten.convolution.default", "c1", {x, w1}, conv_attrs(1, 1), {1, 16, 16, 16});
  y = add1(g, "aten.relu.default", "r1", {y}, {}, {1, 16, 16, 16});
  y = add1(g, "aten.convolution.default", "c2", {y, w2}, conv_attrs(1, 1), {1, 16, 16, 16});
  y = add1(g, "aten.sigmoid.default", "s2", {y}, {}, {1, 16, 16, 16});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(count_kind(d, engine::StepKind::kConv), 2u);
  EXPECT_EQ(count_label(d, "permute_copy"), 2u) << "exactly the edge conversions";
  EXPECT_EQ(d.steps[1].conv.activation, engine::ConvActivation::kRelu) << "relu fuses into the conv";
  EXPECT_EQ(d.steps[1].label, "conv+relu");
  EXPECT_EQ(d.steps[2].label, "conv");
  EXPECT_EQ(d.steps[3].label, "sigmoid") << "other activations run on NHWC after the conv";
  const engine::ConvStep& c = d.steps[1].conv;
  EXPECT_EQ(d.tensors[c.w].shape, (std::vector<int64_t>{16, 3, 3, 8})) << "OHWI weight";
  EXPECT_EQ(d.tensors[c.x].shape, (std::vector<int64_t>{1, 16, 16, 8})) << "NHWC input";
}

// hardswish after a conv decomposes to x * clamp(x + 3, 0, 6) / 6: the NHWC
// rewrite must keep each binary op's operands, in order, and no more (a
// scalar pushed twice once turned x / 6 into 6 / x).
TEST_F(ConvCompiler, ChannelsLastKeepsOperandOrderOfScalarOps) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {1, 4, 8, 8});
  int w = g.add_constant("w", DType::kFloat32, {8, 4, 3, 3}, testing::random_float_bytes(8 * 4 * 9, rng_));
  float six = 6.0f;
  std::vector<uint8_t> six_bytes(4);
  std::memcpy(six_bytes.data(), &six, 4);
  int c6 = g.add_constant("six", DType::kFloat32, {}, six_bytes);
  std::vector<int64_t> shape = {1, 8, 8, 8};
  int y = add1(g, "aten.convolution.default", "c", {x, w}, conv_attrs(1, 1), shape);
  int d = add1(g, "aten.div.Tensor", "div", {y, c6}, {}, shape);
  int s = add1(g, "aten.sub.Tensor", "sub", {c6, d}, {}, shape);
  g.set_outputs({s});
  ir::Graph out = passes::to_channels_last(g);
  int seen = 0;
  for (const ir::Node& n : out.nodes()) {
    if (n.op != "aten.div.Tensor" && n.op != "aten.sub.Tensor") continue;
    ++seen;
    ASSERT_EQ(n.inputs.size(), 2u) << n.name;
    const int scalar_pos = n.op == "aten.div.Tensor" ? 1 : 0;
    EXPECT_EQ(out.value(n.inputs[static_cast<size_t>(scalar_pos)]).numel(), 1) << n.name << ": the 6 stays where it was";
    EXPECT_EQ(out.value(n.inputs[static_cast<size_t>(1 - scalar_pos)]).shape, (std::vector<int64_t>{1, 8, 8, 8}))
        << n.name << " runs on the NHWC tensor";
  }
  EXPECT_EQ(seen, 2);
  engine::EngineDesc desc = compiler::compile_to_desc(g, {});  // and it still lowers
  EXPECT_EQ(count_kind(desc, engine::StepKind::kConv), 1u);
}

// A stride-2 1x1 conv (resnet's downsample) becomes a gather of every other
// pixel plus the 1x1 GEMM; the conv_gemm option "unstrided" or "none" keeps
// it on cuDNN, and the engine records the choice.
TEST_F(ConvCompiler, StridedOneByOneConvIsAGatherAndAGemm) {
  auto build = [&] {
    ir::Graph g;
    int x = g.add_input("x", DType::kFloat32, {2, 4, 8, 6});  // NCHW: c=4, h=8, w=6
    int w = g.add_constant("w", DType::kFloat32, {5, 4, 1, 1}, testing::random_float_bytes(5 * 4, rng_));
    int y = add1(g, "aten.convolution.default", "down", {x, w}, conv_attrs(2, 0), {2, 5, 4, 3});
    g.set_outputs({y});
    return g;
  };
  for (auto mode : {ops::OpOptions::ConvGemm::kUnstrided, ops::OpOptions::ConvGemm::kNone}) {
    compiler::CompileOptions options;
    options.op_options.conv_gemm = mode;
    engine::EngineDesc plain = compiler::compile_to_desc(build(), options);
    EXPECT_EQ(count_kind(plain, engine::StepKind::kConv), 1u) << "conv_gemm=" << ops::conv_gemm_name(mode);
    ASSERT_NE(plain.find_metadata("conv_gemm"), nullptr);
    EXPECT_EQ(*plain.find_metadata("conv_gemm"), ops::conv_gemm_name(mode));
  }

  ir::Graph g = build();
  ir::Graph nhwc = passes::to_channels_last(g);
  passes::ExecPlan plan = passes::fuse(nhwc);
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(count_kind(d, engine::StepKind::kConv), 0u);
  EXPECT_EQ(count_label(d, "strided_gather"), 1u);
  const passes::PlannedOp* gather = nullptr;
  const passes::PlannedOp* gemm = nullptr;
  for (const auto& op : plan.ops) {
    if (op.label == "strided_gather") gather = &op;
    if (op.is<passes::GemmPlan>()) gemm = &op;
  }
  ASSERT_NE(gather, nullptr);
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(*d.find_metadata("conv_gemm"), "all");
  const passes::GemmPlan& gp = *gemm->as<passes::GemmPlan>();
  const passes::PointwisePlan& gather_plan = *gather->as<passes::PointwisePlan>();
  EXPECT_EQ(gp.m, 2 * 4 * 3);
  EXPECT_EQ(gp.k, 4);
  EXPECT_EQ(gp.n, 5);
  EXPECT_EQ(gp.a, gather_plan.out) << "the GEMM reads the gathered rows";
  // Every gathered element comes from x_nhwc[n, 2i, 2j, c].
  const std::vector<int64_t>& coef = gather_plan.input_map.coef;
  ASSERT_EQ(coef.size(), 4u);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t c = 0; c < 4; ++c) {
          const int64_t got = gather_plan.input_map.base + n * coef[0] + i * coef[1] + j * coef[2] + c * coef[3];
          ASSERT_EQ(got, ((n * 8 + 2 * i) * 6 + 2 * j) * 4 + c) << n << "," << i << "," << j << "," << c;
        }
}

TEST_F(ConvCompiler, OneByOneConvIsAGemmWithResidualAndRelu) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {2, 16, 8, 8});
  int w = g.add_constant("w", DType::kFloat32, {16, 16, 1, 1}, testing::random_float_bytes(256, rng_));
  int b = g.add_constant("b", DType::kFloat32, {16}, testing::random_float_bytes(16, rng_));
  int y = add1(g, "aten.convolution.default", "c", {x, w, b}, conv_attrs(1, 0), {2, 16, 8, 8});
  y = add1(g, "aten.add.Tensor", "res", {y, x}, {}, {2, 16, 8, 8});
  y = add1(g, "aten.relu.default", "r", {y}, {}, {2, 16, 8, 8});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(count_kind(d, engine::StepKind::kGemm), 1u);
  EXPECT_EQ(count_kind(d, engine::StepKind::kConv), 0u);
  for (const auto& s : d.steps) {
    if (s.kind != engine::StepKind::kGemm) continue;
    EXPECT_EQ(s.gemm.m, 2 * 8 * 8);
    EXPECT_EQ(s.gemm.n, 16);
    EXPECT_EQ(s.gemm.k, 16);
    EXPECT_TRUE(s.gemm.b_transposed);
    EXPECT_EQ(s.gemm.epilogue, engine::GemmEpilogue::kReluBias);
    EXPECT_NE(s.gemm.c, engine::kNoTensor);
    EXPECT_EQ(s.gemm.beta, 1.0f);
  }
}

TEST_F(ConvCompiler, ResidualAddFusesIntoTheConvThatRunsLast) {
  // out = relu(conv_a(x) + conv_b(x)) where conv_b comes later in the graph.
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {1, 4, 8, 8});
  int wa = g.add_constant("wa", DType::kFloat32, {4, 4, 3, 3}, testing::random_float_bytes(144, rng_));
  int wb = g.add_constant("wb", DType::kFloat32, {4, 4, 3, 3}, testing::random_float_bytes(144, rng_));
  int a = add1(g, "aten.convolution.default", "ca", {x, wa}, conv_attrs(1, 1), {1, 4, 8, 8});
  int b = add1(g, "aten.convolution.default", "cb", {x, wb}, conv_attrs(1, 1), {1, 4, 8, 8});
  int y = add1(g, "aten.add.Tensor", "sum", {a, b}, {}, {1, 4, 8, 8});
  y = add1(g, "aten.relu.default", "r", {y}, {}, {1, 4, 8, 8});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(count_kind(d, engine::StepKind::kConv), 2u);
  // The fused conv must run after the conv that produces its z.
  int plain = -1, fused = -1;
  for (size_t i = 0; i < d.steps.size(); ++i) {
    if (d.steps[i].kind != engine::StepKind::kConv) continue;
    (d.steps[i].conv.z == engine::kNoTensor ? plain : fused) = static_cast<int>(i);
  }
  ASSERT_GE(plain, 0);
  ASSERT_GE(fused, 0);
  EXPECT_LT(plain, fused);
  EXPECT_EQ(d.steps[static_cast<size_t>(fused)].conv.z, d.steps[static_cast<size_t>(plain)].conv.out);
  EXPECT_EQ(d.steps[static_cast<size_t>(fused)].conv.activation, engine::ConvActivation::kRelu);
}

TEST_F(ConvCompiler, SqueezeExcitationStaysChannelsLast) {
  // x -> conv -> mean(h,w) -> 1x1 conv -> relu -> 1x1 conv -> hardsigmoid -> mul(x', s)
  const int64_t c = 16;
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {2, c, 8, 8});
  int w0 = g.add_constant("w0", DType::kFloat32, {c, 1, 3, 3}, testing::random_float_bytes(c * 9, rng_));
  int w1 = g.add_constant("w1", DType::kFloat32, {4, c, 1, 1}, testing::random_float_bytes(4 * c, rng_));
  int w2 = g.add_constant("w2", DType::kFloat32, {c, 4, 1, 1}, testing::random_float_bytes(4 * c, rng_));
  int y = add1(g, "aten.convolution.default", "dw", {x, w0}, conv_attrs(1, 1, c), {2, c, 8, 8});
  int m = add1(g, "aten.mean.dim", "pool", {y}, {{"dim", std::vector<int64_t>{-1, -2}}, {"keepdim", true}},
               {2, c, 1, 1});
  int s = add1(g, "aten.convolution.default", "fc1", {m, w1}, conv_attrs(1, 0), {2, 4, 1, 1});
  s = add1(g, "aten.relu.default", "act", {s}, {}, {2, 4, 1, 1});
  s = add1(g, "aten.convolution.default", "fc2", {s, w2}, conv_attrs(1, 0), {2, c, 1, 1});
  s = add1(g, "aten.hardsigmoid.default", "gate", {s}, {}, {2, c, 1, 1});
  int out = add1(g, "aten.mul.Tensor", "scale", {y, s}, {}, {2, c, 8, 8});
  g.set_outputs({out});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(count_label(d, "permute_copy"), 2u) << "only the engine edges";
  EXPECT_EQ(count_kind(d, engine::StepKind::kGemm), 2u) << "the 1x1 convs are GEMMs";
  EXPECT_EQ(count_kind(d, engine::StepKind::kConv), 0u) << "the depthwise conv is a generated kernel";
  EXPECT_EQ(count_label(d, "dwconv"), 1u);
}

// The mean over a large NHWC map reads each channel column from few blocks:
// it splits into partial means over equal chunks (a float32 temporary) and a
// mean of those; a small map stays one kernel.
TEST_F(ConvCompiler, LargeSpatialMeanSplitsIntoChunks) {
  for (int64_t hw : {64, 8}) {
    const int64_t c = 32;
    ir::Graph g;
    int x = g.add_input("x", DType::kFloat32, {2, c, hw, hw});
    int w0 = g.add_constant("w0", DType::kFloat32, {c, 1, 3, 3}, testing::random_float_bytes(c * 9, rng_));
    int y = add1(g, "aten.convolution.default", "dw", {x, w0}, conv_attrs(1, 1, c), {2, c, hw, hw});
    int m = add1(g, "aten.mean.dim", "pool", {y}, {{"dim", std::vector<int64_t>{-1, -2}}, {"keepdim", true}},
                 {2, c, 1, 1});
    int out = add1(g, "aten.mul.Tensor", "scale", {y, m}, {}, {2, c, hw, hw});
    g.set_outputs({out});
    engine::EngineDesc d = compiler::compile_to_desc(g, {});
    if (hw == 8) {
      EXPECT_EQ(count_label(d, "mean"), 1u) << "512 rows: one kernel";
      continue;
    }
    // 4096 rows per channel, 2 blocks: 64 chunks of 64 rows give 128 blocks.
    ASSERT_EQ(count_label(d, "mean(64 chunks)"), 1u);
    ASSERT_EQ(count_label(d, "mean(of chunks)"), 1u);
    size_t first = d.steps.size(), second = d.steps.size();
    for (size_t i = 0; i < d.steps.size(); ++i) {
      if (d.steps[i].label == "mean(64 chunks)") first = i;
      if (d.steps[i].label == "mean(of chunks)") second = i;
    }
    ASSERT_EQ(second, first + 1);
    // The first writes the float32 temporary [2, 64, c] the second reads.
    const engine::KernelStep& a = d.steps[first].kernel;
    const engine::KernelStep& b = d.steps[second].kernel;
    const engine::TensorDesc& partial = d.tensors[a.args[0].tensor];
    EXPECT_EQ(partial.dtype, DType::kFloat32);
    EXPECT_EQ(partial.shape, (std::vector<int64_t>{2, 64, c}));
    EXPECT_EQ(b.args[1].tensor, a.args[0].tensor);
    EXPECT_EQ(a.grid[0] * a.grid[1], 128u);
  }
}

TEST(PoolShapes, FollowPyTorchRules) {
  EXPECT_EQ(ops::pool_output_size(112, 3, 1, 2, 1, false), 56);   // resnet stem
  EXPECT_EQ(ops::pool_output_size(5, 2, 0, 2, 1, false), 2);
  EXPECT_EQ(ops::pool_output_size(5, 2, 0, 2, 1, true), 3);
  EXPECT_EQ(ops::pool_output_size(6, 3, 1, 2, 1, true), 4);
  EXPECT_EQ(ops::pool_output_size(5, 2, 1, 2, 1, true), 3) << "a 4th window would start in the padding";
  EXPECT_EQ(ops::pool_output_size(10, 3, 0, 1, 2, false), 6) << "dilation";
}

TEST(PoolShapes, CheckSupportExplainsRefusals) {
  compiler::OpQuery q;
  q.op = "aten.avg_pool2d.default";
  q.inputs = {{DType::kFloat32, {1, 3, 8, 8}, false}};
  q.outputs = {{DType::kFloat32, {1, 3, 4, 4}, false}};
  q.attrs = {{"kernel_size", std::vector<int64_t>{2, 2}}, {"stride", std::vector<int64_t>{}}};
  EXPECT_FALSE(compiler::check_support(q).has_value());
  q.attrs["padding"] = std::vector<int64_t>{2, 2};
  auto why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("half the kernel"), std::string::npos) << *why;
  q.attrs.erase("padding");
  q.inputs[0].shape = {3, 8, 8};
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("4-D"), std::string::npos) << *why;

  compiler::OpQuery mp;
  mp.op = "aten.max_pool2d_with_indices.default";
  mp.inputs = {{DType::kFloat32, {1, 3, 8, 8}, false}};
  mp.outputs = {{DType::kFloat32, {1, 3, 4, 4}, false}, {DType::kInt64, {1, 3, 4, 4}, false}};
  mp.attrs = {{"kernel_size", std::vector<int64_t>{2, 2}}};
  EXPECT_FALSE(compiler::check_support(mp).has_value()) << "int64 indices are not computed";
}

TEST(ConvSupport, RefusesWhatItCannotLower) {
  compiler::OpQuery q;
  q.op = "aten.convolution.default";
  q.inputs = {{DType::kFloat32, {1, 3, 8, 8}, false}, {DType::kFloat32, {4, 3, 3, 3}, true}};
  q.outputs = {{DType::kFloat32, {1, 4, 6, 6}, false}};
  q.attrs = conv_attrs(1, 0);
  EXPECT_FALSE(compiler::check_support(q).has_value());
  // Transposed: the weight [4, 3, 3, 3] is [c_in, k/groups, r, s], so it
  // does not fit 3 input channels (tests/cpp/compiler_convt_test.cpp has more).
  q.attrs["transposed"] = true;
  auto why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("transposed"), std::string::npos);
  q.attrs["transposed"] = false;
  q.inputs[1].is_constant = false;
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("constant"), std::string::npos);
  q.inputs[1].is_constant = true;
  // 1-D convolutions are taken; 3-D ones are not.
  q.inputs = {{DType::kFloat32, {1, 3, 8}, false}, {DType::kFloat32, {4, 3, 3}, true}};
  q.outputs = {{DType::kFloat32, {1, 4, 6}, false}};
  q.attrs["stride"] = std::vector<int64_t>{1};
  q.attrs["padding"] = std::vector<int64_t>{0};
  q.attrs["dilation"] = std::vector<int64_t>{1};
  q.attrs["output_padding"] = std::vector<int64_t>{0};
  EXPECT_FALSE(compiler::check_support(q).has_value());
  q.inputs = {{DType::kFloat32, {1, 3, 8, 8, 8}, false}, {DType::kFloat32, {4, 3, 3, 3, 3}, true}};
  q.outputs = {{DType::kFloat32, {1, 4, 6, 6, 6}, false}};
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("1-D and 2-D"), std::string::npos);
}

TEST_F(ConvCompiler, PoolingLowersToChannelsLastKernels) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {1, 8, 9, 9});
  int y = g.nodes().size();
  int n = g.add_node("aten.max_pool2d_with_indices.default", "mp", {x},
                     {{"kernel_size", std::vector<int64_t>{3, 3}}, {"stride", std::vector<int64_t>{2, 2}},
                      {"padding", std::vector<int64_t>{1, 1}}, {"ceil_mode", true}},
                     {{DType::kFloat32, {1, 8, 5, 5}}, {DType::kInt64, {1, 8, 5, 5}}});
  y = g.nodes()[static_cast<size_t>(n)].outputs[0];
  y = add1(g, "aten._adaptive_avg_pool2d.default", "ap", {y}, {{"output_size", std::vector<int64_t>{2, 3}}},
           {1, 8, 2, 3});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(d.steps[1].label, "max_pool2d_nhwc");
  EXPECT_EQ(d.steps[2].label, "adaptive_avg_pool2d_nhwc");
  EXPECT_NE(d.modules.at(0).source.find("NaN wins"), std::string::npos);
}

}  // namespace
}  // namespace kiln
