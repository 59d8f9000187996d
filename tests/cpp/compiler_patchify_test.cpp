// Convolutions whose kernel equals their stride as a patch gather plus a GEMM
// (passes/patchify_conv.cpp), and layout kernels reading through the chain of
// permutes, views, slices and selects before them (ops/layout_ops.cpp), no
// GPU needed: the step plan is run by a small interpreter here (layout pieces
// through their affine maps, GEMMs as loops) and compared with references
// written here (a naive convolution).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "ops/conv_ops.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using engine::DType;
using Shape = std::vector<int64_t>;

std::vector<float> floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

int add1(ir::Graph& g, const std::string& op, const std::string& name, std::vector<int> in,
         std::map<std::string, ir::Attr> attrs, Shape shape) {
  int n = g.add_node(op, name, std::move(in), std::move(attrs), {{DType::kFloat32, std::move(shape)}});
  return g.nodes()[static_cast<size_t>(n)].outputs[0];
}

// Attributes of a convolution with stride.size() (1 or 2) spatial dims.
std::map<std::string, ir::Attr> conv_attrs(Shape stride, Shape pad, int64_t groups = 1, Shape dilation = {}) {
  if (dilation.empty()) dilation = Shape(stride.size(), 1);
  return {{"stride", stride},    {"padding", pad},   {"dilation", dilation}, {"transposed", false},
          {"output_padding", Shape(stride.size(), 0)}, {"groups", groups}};
}

// Naive 2-D convolution, groups 1, dilation 1, no padding.
std::vector<float> ref_conv(const std::vector<float>& x, const Shape& xs, const std::vector<float>& w, const Shape& ws,
                            const std::vector<float>* bias, const Shape& stride, const Shape& ys) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], k = ws[0], r = ws[2], s = ws[3];
  const int64_t p = ys[2], q = ys[3];
  std::vector<float> y(static_cast<size_t>(n * k * p * q));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < k; ++o)
      for (int64_t i = 0; i < p; ++i)
        for (int64_t j = 0; j < q; ++j) {
          double acc = bias ? (*bias)[static_cast<size_t>(o)] : 0.0;
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t u = 0; u < r; ++u)
              for (int64_t v = 0; v < s; ++v)
                acc += static_cast<double>(
                           x[static_cast<size_t>(((b * c + ci) * h + i * stride[0] + u) * wd + j * stride[1] + v)]) *
                       w[static_cast<size_t>(((o * c + ci) * r + u) * s + v)];
          y[static_cast<size_t>(((b * k + o) * p + i) * q + j)] = static_cast<float>(acc);
        }
  return y;
}

// The passes compile_to_desc runs up to fusion, for float32.
passes::ExecPlan plan_of(ir::Graph& g) {
  g.verify();
  passes::fold_constants(g);
  g = passes::fold_batch_norm(g);
  g = passes::patchify_convolutions(g);
  g = passes::to_channels_last(g);
  passes::fold_constants(g);
  return passes::fuse(g);
}

// Runs a float32 plan made of layout kernels and GEMMs on the CPU; returns
// the graph's first output.
std::vector<float> run_plan(const ir::Graph& g, const passes::ExecPlan& plan, const std::vector<float>& x) {
  std::map<int, std::vector<float>> storage;
  storage[g.inputs().at(0)] = x;
  auto buffer = [&](int v) -> std::vector<float>& {
    const int root = plan.storage_of(v);
    auto it = storage.find(root);
    if (it != storage.end()) return it->second;
    const ir::Value& value = g.value(root);
    if (value.is_constant) return storage[root] = floats(value.data);
    return storage[root] = std::vector<float>(static_cast<size_t>(value.numel()), NAN);
  };
  for (const passes::PlannedOp& op : plan.ops) {
    if (const auto* p = op.as<passes::PointwisePlan>()) {
      bool copy = p->input_map.coef.empty() && p->output_map.coef.empty();
      for (int node : p->nodes) copy &= g.nodes()[static_cast<size_t>(node)].op == "kiln.copy";
      EXPECT_TRUE(copy || p->nodes.empty()) << "unexpected elementwise step " << op.label;
      const std::vector<float>& in = buffer(p->inputs.at(0));
      std::vector<float>& out = buffer(p->out);
      if (copy) {
        out = in;
        continue;
      }
      const Shape iter = p->iter_shape.empty() ? g.value(p->out).shape : p->iter_shape;
      const Shape own = ir::contiguous_strides(iter);
      for (int64_t i = 0; i < ir::numel_of(iter); ++i) {
        int64_t src = p->input_map.base, dst = p->output_map.base;
        for (size_t j = 0; j < iter.size(); ++j) {
          const int64_t idx = (i / own[j]) % iter[j];
          src += idx * p->input_map.coef.at(j);
          dst += idx * (p->output_map.coef.empty() ? own[j] : p->output_map.coef[j]);
        }
        out.at(static_cast<size_t>(dst)) = in.at(static_cast<size_t>(src));
      }
    } else if (const auto* m = op.as<passes::GemmPlan>()) {
      EXPECT_EQ(m->batch, 1);
      EXPECT_EQ(m->c, -1);
      const std::vector<float>& a = buffer(m->a);
      const std::vector<float>& b = buffer(m->b);
      const std::vector<float>* bias = m->bias >= 0 ? &buffer(m->bias) : nullptr;
      std::vector<float>& out = buffer(m->out);
      for (int64_t i = 0; i < m->m; ++i)
        for (int64_t j = 0; j < m->n; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < m->k; ++k)
            acc += static_cast<double>(a[static_cast<size_t>(i * m->k + k)]) *
                   b[static_cast<size_t>(m->b_transposed ? j * m->k + k : k * m->n + j)];
          acc *= m->alpha;
          if (bias) acc += (*bias)[static_cast<size_t>(j)];
          if (m->epilogue == engine::GemmEpilogue::kRelu || m->epilogue == engine::GemmEpilogue::kReluBias)
            acc = std::max(acc, 0.0);
          out[static_cast<size_t>(i * m->n + j)] = static_cast<float>(acc);
        }
    } else {
      ADD_FAILURE() << "unexpected step " << op.label;
    }
  }
  return buffer(g.outputs().at(0));
}

size_t count_plans(const passes::ExecPlan& plan, const std::string& label) {
  size_t n = 0;
  for (const auto& op : plan.ops) n += op.label == label;
  return n;
}

template <class T>
size_t count_kind(const passes::ExecPlan& plan) {
  size_t n = 0;
  for (const auto& op : plan.ops) n += op.is<T>();
  return n;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
}

class Patchify : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  std::vector<uint8_t> random(int64_t count) { return testing::random_float_bytes(static_cast<size_t>(count), rng_); }

  // x -> conv(kernel == stride) -> output; checks the plan (one gather, one
  // GEMM, the permute to the NCHW output) and its numbers against the naive
  // convolution.
  void check_conv(const Shape& xs, int64_t k_out, const Shape& kernel, bool bias, size_t slices) {
    SCOPED_TRACE("seed " + std::to_string(seed_) + " x " + ir::shape_to_string(xs) + " kernel " +
                 ir::shape_to_string(kernel));
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, xs);
    Shape ws = {k_out, xs[1]}, ys = {xs[0], k_out};
    for (size_t i = 0; i < kernel.size(); ++i) {
      ws.push_back(kernel[i]);
      ys.push_back(xs[2 + i] / kernel[i]);
    }
    const int w = g.add_constant("w", DType::kFloat32, ws, random(ir::numel_of(ws)));
    std::vector<int> in = {x, w};
    if (bias) in.push_back(g.add_constant("b", DType::kFloat32, {k_out}, random(k_out)));
    const int y = add1(g, "aten.convolution.default", "patch", in, conv_attrs(kernel, Shape(kernel.size(), 0)), ys);
    g.set_outputs({y});
    const ir::Graph original = g;

    ir::Graph rewritten = passes::patchify_convolutions(g);
    size_t linears = 0, crops = 0;
    for (const ir::Node& n : rewritten.nodes()) {
      EXPECT_FALSE(ops::is_conv_op(n.op)) << rewritten.describe();
      linears += n.op == "aten.linear.default";
      crops += n.op == "aten.slice_copy.Tensor";
    }
    EXPECT_EQ(linears, 1u);
    EXPECT_EQ(crops, slices) << "a slice per extent the kernel does not divide";

    // The engine format accepts it (a GEMM operand's stored dims split into its rows).
    EXPECT_NO_THROW(compiler::compile_graph(g, {}));
    passes::ExecPlan plan = plan_of(g);
    EXPECT_EQ(plan.ops.size(), 3u) << "the patch gather, the GEMM, the NCHW result";
    EXPECT_EQ(count_plans(plan, "permute_copy"), 2u);
    EXPECT_EQ(count_kind<passes::GemmPlan>(plan), 1u);
    EXPECT_EQ(count_kind<passes::ConvPlan>(plan), 0u);
    const std::vector<float> xin = floats(random(ir::numel_of(xs)));
    const std::vector<float> b = bias ? floats(original.value(in[2]).data) : std::vector<float>{};
    expect_close(run_plan(g, plan, xin),
                 ref_conv(xin, xs, floats(original.value(w).data), ws, bias ? &b : nullptr, kernel, ys));
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(Patchify, VitPatchEmbeddingIsAGatherAndAGemm) { check_conv({2, 3, 32, 48}, 16, {16, 16}, true, 0); }
TEST_F(Patchify, NonSquarePatchesWithoutBias) { check_conv({1, 5, 6, 12}, 7, {2, 3}, false, 0); }
TEST_F(Patchify, LeftoverRowsAndColumnsAreCropped) { check_conv({2, 4, 9, 11}, 6, {2, 3}, true, 2); }
TEST_F(Patchify, OneChannelOnePatchRow) { check_conv({2, 1, 4, 8}, 5, {4, 2}, true, 0); }

// The batch norm after a patch embedding folds into the conv first; the
// GEMM keeps the folded bias.
TEST_F(Patchify, KeepsTheFoldedBatchNormBias) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t c = 3, k = 4;
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {1, c, 8, 8});
  const int w = g.add_constant("w", DType::kFloat32, {k, c, 4, 4}, random(k * c * 16));
  const int y = add1(g, "aten.convolution.default", "conv", {x, w}, conv_attrs({4, 4}, {0, 0}), {1, k, 2, 2});
  std::vector<float> var = floats(random(k));
  for (float& v : var) v = 0.5f + std::fabs(v);
  std::vector<uint8_t> var_bytes(var.size() * 4);
  std::memcpy(var_bytes.data(), var.data(), var_bytes.size());
  std::vector<int> bn_in = {y};
  for (const char* p : {"gamma", "beta", "mean"}) bn_in.push_back(g.add_constant(p, DType::kFloat32, {k}, random(k)));
  bn_in.push_back(g.add_constant("var", DType::kFloat32, {k}, var_bytes));
  const int bn = g.add_node(ops::kBatchNorm, "bn", bn_in, {{"eps", 1e-5}},
                            {{DType::kFloat32, {1, k, 2, 2}}, {DType::kFloat32, {0}}, {DType::kFloat32, {0}}});
  g.set_outputs({g.nodes()[static_cast<size_t>(bn)].outputs[0]});

  const ir::Graph folded = passes::fold_batch_norm(g);
  ASSERT_EQ(folded.nodes().size(), 1u);
  const ir::Node& conv = folded.nodes()[0];
  const ir::Graph patched = passes::patchify_convolutions(folded);
  bool found = false;
  for (const ir::Node& n : patched.nodes())
    if (n.op == "aten.linear.default") {
      found = true;
      ASSERT_EQ(n.inputs.size(), 3u) << "the folded bias";
      EXPECT_EQ(patched.value(n.inputs[2]).data, folded.value(conv.inputs[2]).data);
    }
  EXPECT_TRUE(found) << patched.describe();

  passes::ExecPlan plan = plan_of(g);
  const std::vector<float> xin = floats(random(c * 64));
  const std::vector<float> fb = floats(folded.value(conv.inputs[2]).data);
  expect_close(run_plan(g, plan, xin),
               ref_conv(xin, {1, c, 8, 8}, floats(folded.value(conv.inputs[1]).data), {k, c, 4, 4}, &fb, {4, 4},
                        {1, k, 2, 2}));
}

// What the rewrite must leave to the convolution lowering.
TEST_F(Patchify, LeavesOtherConvolutionsAlone) {
  struct Case {
    std::string what;
    Shape x, w;
    std::map<std::string, ir::Attr> attrs;
    Shape y;
    bool weight_is_input = false;
  };
  const std::vector<Case> cases = {
      {"stride != kernel", {1, 3, 16, 16}, {8, 3, 4, 4}, conv_attrs({2, 2}, {0, 0}), {1, 8, 7, 7}},
      {"stride != kernel in one dim", {1, 3, 16, 16}, {8, 3, 4, 4}, conv_attrs({4, 2}, {0, 0}), {1, 8, 4, 7}},
      {"padding", {1, 3, 16, 16}, {8, 3, 4, 4}, conv_attrs({4, 4}, {1, 1}), {1, 8, 4, 4}},
      {"groups", {1, 4, 16, 16}, {8, 2, 4, 4}, conv_attrs({4, 4}, {0, 0}, 2), {1, 8, 4, 4}},
      {"dilation", {1, 3, 16, 16}, {8, 3, 2, 2}, conv_attrs({2, 2}, {0, 0}, 1, {2, 2}), {1, 8, 8, 8}},
      {"1x1", {1, 3, 16, 16}, {8, 3, 1, 1}, conv_attrs({1, 1}, {0, 0}), {1, 8, 16, 16}},
      // the patches could be the input's own order: the GEMM could not read them
      {"1-D", {1, 3, 16}, {8, 3, 4}, conv_attrs({4}, {0}), {1, 8, 4}},
      {"kernel height 1", {1, 3, 4, 16}, {8, 3, 1, 4}, conv_attrs({1, 4}, {0, 0}), {1, 8, 4, 4}},
      {"one patch per row", {1, 3, 16, 4}, {8, 3, 4, 4}, conv_attrs({4, 4}, {0, 0}), {1, 8, 4, 1}},
      {"computed weight", {1, 3, 16, 16}, {8, 3, 4, 4}, conv_attrs({4, 4}, {0, 0}), {1, 8, 4, 4}, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, c.x);
    const int w = c.weight_is_input ? g.add_input("w", DType::kFloat32, c.w)
                                    : g.add_constant("w", DType::kFloat32, c.w, random(ir::numel_of(c.w)));
    g.set_outputs({add1(g, "aten.convolution.default", "conv", {x, w}, c.attrs, c.y)});
    const ir::Graph out = passes::patchify_convolutions(g);
    out.verify();
    ASSERT_EQ(out.nodes().size(), 1u) << out.describe();
    EXPECT_EQ(out.nodes()[0].op, "aten.convolution.default");
  }
  // conv_gemm "unstrided" and "none" keep these convolutions on cuDNN.
  for (auto mode : {ops::OpOptions::ConvGemm::kUnstrided, ops::OpOptions::ConvGemm::kNone}) {
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, {1, 3, 16, 16});
    const int w = g.add_constant("w", DType::kFloat32, {8, 3, 4, 4}, random(8 * 3 * 16));
    g.set_outputs({add1(g, "aten.convolution.default", "conv", {x, w}, conv_attrs({4, 4}, {0, 0}), {1, 8, 4, 4})});
    ops::OpOptions options;
    options.conv_gemm = mode;
    EXPECT_EQ(passes::patchify_convolutions(g, options).nodes()[0].op, "aten.convolution.default")
        << ops::conv_gemm_name(mode);
  }
  // Transposed: kernel == stride, but it scatters.
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {1, 3, 4, 4});
  const int w = g.add_constant("w", DType::kFloat32, {3, 8, 4, 4}, random(3 * 8 * 16));
  auto attrs = conv_attrs({4, 4}, {0, 0});
  attrs["transposed"] = true;
  g.set_outputs({add1(g, "aten.convolution.default", "convt", {x, w}, attrs, {1, 8, 16, 16})});
  EXPECT_EQ(passes::patchify_convolutions(g).nodes()[0].op, "aten.convolution.default");
}

// torchvision's ViT reads the patch embedding as tokens: conv -> view
// [n, k, p*q] -> permute [n, p*q, k] -> cat after the class token. The
// permute back to NCHW, the view and that permute compose to the GEMM's own
// row order: no kernel between the GEMM and the cat.
TEST_F(Patchify, TokensAreTheGemmOutputItself) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t n = 2, c = 3, k = 8;
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {n, c, 16, 16});
  const int w = g.add_constant("w", DType::kFloat32, {k, c, 8, 8}, random(k * c * 64));
  const int b = g.add_constant("b", DType::kFloat32, {k}, random(k));
  const int cls = g.add_constant("cls", DType::kFloat32, {n, 1, k}, random(n * k));
  int y = add1(g, "aten.convolution.default", "conv_proj", {x, w, b}, conv_attrs({8, 8}, {0, 0}), {n, k, 2, 2});
  y = add1(g, "aten.view_copy.default", "flat", {y}, {{"size", Shape{n, k, 4}}}, {n, k, 4});
  y = add1(g, "aten.permute_copy.default", "tokens", {y}, {{"dims", Shape{0, 2, 1}}}, {n, 4, k});
  y = add1(g, "aten.cat.default", "cat", {cls, y}, {{"dim", int64_t{1}}}, {n, 5, k});
  g.set_outputs({y});
  const ir::Graph original = g;
  passes::ExecPlan plan = plan_of(g);
  std::vector<std::string> labels;
  for (const auto& op : plan.ops) labels.push_back(op.label);
  ASSERT_EQ(labels, (std::vector<std::string>{"permute_copy", "linear", "cat", "cat"}));
  EXPECT_EQ(plan.ops[0].reads(), std::vector<int>{g.inputs()[0]}) << "the gather reads the image";
  EXPECT_EQ(plan.ops[3].reads(), std::vector<int>{plan.ops[1].writes()}) << "the cat reads the GEMM's output";

  const std::vector<float> xin = floats(random(n * c * 256));
  const std::vector<float> bias = floats(original.value(b).data);
  const std::vector<float> token = floats(original.value(cls).data);
  const std::vector<float> conv =
      ref_conv(xin, {n, c, 16, 16}, floats(original.value(w).data), {k, c, 8, 8}, &bias, {8, 8}, {n, k, 2, 2});
  std::vector<float> want;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t o = 0; o < k; ++o)
        want.push_back(t == 0 ? token[static_cast<size_t>(i * k + o)]
                              : conv[static_cast<size_t>((i * k + o) * 4 + t - 1)]);
  expect_close(run_plan(g, plan, xin), want);
}

// Inside a conv stack (ConvNeXt's downsampling) the input is channels-last
// already: the gather reads it as it is and the GEMM's output is the next
// conv's channels-last input, so the only NCHW conversions are the engine's
// edges.
TEST_F(Patchify, InsideAConvStackStaysChannelsLast) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {1, 8, 16, 16});
  const int w1 = g.add_constant("w1", DType::kFloat32, {8, 8, 3, 3}, random(8 * 8 * 9));
  const int w2 = g.add_constant("w2", DType::kFloat32, {16, 8, 2, 2}, random(16 * 8 * 4));
  const int w3 = g.add_constant("w3", DType::kFloat32, {16, 16, 3, 3}, random(16 * 16 * 9));
  int y = add1(g, "aten.convolution.default", "c1", {x, w1}, conv_attrs({1, 1}, {1, 1}), {1, 8, 16, 16});
  y = add1(g, "aten.convolution.default", "down", {y, w2}, conv_attrs({2, 2}, {0, 0}), {1, 16, 8, 8});
  y = add1(g, "aten.relu.default", "relu", {y}, {}, {1, 16, 8, 8});
  y = add1(g, "aten.convolution.default", "c3", {y, w3}, conv_attrs({1, 1}, {1, 1}), {1, 16, 8, 8});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  std::vector<std::string> labels;
  for (const auto& s : d.steps) labels.push_back(s.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"permute_copy", "conv", "permute_copy", "linear+relu", "conv",
                                              "permute_copy"}))
      << "edge, conv, patch gather from NHWC, GEMM, conv, edge";
}

class LayoutChain : public Patchify {};

// Layout kernels read through the permutes, views, slices and selects before
// them when nothing else reads those: one kernel for a chain.
TEST_F(LayoutChain, LayoutChainsComposeIntoOneKernel) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const Shape xs = {2, 3, 4, 10};
  auto build = [&](bool second_reader) {
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, xs);
    int a = add1(g, "aten.permute_copy.default", "p1", {x}, {{"dims", Shape{0, 1, 3, 2}}}, {2, 3, 10, 4});
    int v = add1(g, "aten.view_copy.default", "v", {a}, {{"size", Shape{6, 10, 4}}}, {6, 10, 4});
    int s = add1(g, "aten.slice_copy.Tensor", "s", {v},
                 {{"dim", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{10}}, {"step", int64_t{3}}}, {6, 3, 4});
    int p = add1(g, "aten.transpose_copy.int", "t", {s}, {{"dim0", int64_t{0}}, {"dim1", int64_t{2}}}, {4, 3, 6});
    std::vector<int> outs = {p};
    if (second_reader) outs.push_back(a);
    g.set_outputs(outs);
    return g;
  };
  const std::vector<float> xin = floats(random(ir::numel_of(xs)));
  // Reference: out[h][j][r] = x[r / 3][r % 3][h][2 + 3 j]
  std::vector<float> want;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t r = 0; r < 6; ++r) want.push_back(xin[static_cast<size_t>((r * 4 + h) * 10 + 2 + 3 * j)]);
  {
    ir::Graph g = build(false);
    passes::ExecPlan plan = passes::fuse(g);
    ASSERT_EQ(plan.ops.size(), 1u) << "permute, view, slice and transpose in one kernel";
    EXPECT_EQ(plan.ops[0].reads(), std::vector<int>{g.inputs()[0]});
    expect_close(run_plan(g, plan, xin), want);
  }
  {
    ir::Graph g = build(true);  // the first permute is an output too: computed once, read by the rest
    passes::ExecPlan plan = passes::fuse(g);
    EXPECT_EQ(count_plans(plan, "permute_copy"), 1u);
    EXPECT_EQ(count_plans(plan, "transpose_copy"), 1u);
    EXPECT_EQ(count_plans(plan, "slice_copy"), 0u);
    expect_close(run_plan(g, plan, xin), want);
  }
}

// A chain whose composition is the identity is an alias, and a view that
// would need a copy of the strided source ends the chain there.
TEST_F(LayoutChain, LayoutChainsThatCancelAreAliases) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {2, 3, 4});
  int a = add1(g, "aten.permute_copy.default", "p1", {x}, {{"dims", Shape{2, 0, 1}}}, {4, 2, 3});
  int b = add1(g, "aten.permute_copy.default", "p2", {a}, {{"dims", Shape{1, 2, 0}}}, {2, 3, 4});
  int r = add1(g, "aten.relu.default", "relu", {b}, {}, {2, 3, 4});
  g.set_outputs({r});
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u) << "only the relu";
  EXPECT_EQ(plan.storage_of(b), g.inputs()[0]);

  ir::Graph h;
  const int y = h.add_input("y", DType::kFloat32, {2, 3, 4});
  int t = add1(h, "aten.permute_copy.default", "t", {y}, {{"dims", Shape{0, 2, 1}}}, {2, 4, 3});
  int v = add1(h, "aten.view_copy.default", "v", {t}, {{"size", Shape{2, 12}}}, {2, 12});  // merges strided dims
  int u = add1(h, "aten.permute_copy.default", "u", {v}, {{"dims", Shape{1, 0}}}, {12, 2});
  h.set_outputs({u});
  passes::ExecPlan hp = passes::fuse(h);
  ASSERT_EQ(hp.ops.size(), 2u) << "the view needs the first permute's result";
  std::vector<float> yin(24);
  for (size_t i = 0; i < yin.size(); ++i) yin[i] = static_cast<float>(i);
  std::vector<float> want;
  for (int64_t j = 0; j < 12; ++j)
    for (int64_t i = 0; i < 2; ++i) want.push_back(yin[static_cast<size_t>(i * 12 + (j % 3) * 4 + j / 3)]);
  expect_close(run_plan(h, hp, yin), want);
}

// The engine describes a storage by one shape and checks it where a
// convolution or a GEMM reads: a chain that keeps its source's element order
// but not its shape is one kernel, not an alias, when such a step reads it.
TEST_F(LayoutChain, AliasesKeepTheShapesConvolutionsAndGemmsRead) {
  // Tokens [n, h*w, c] back to an image for a conv (PVT, SegFormer): the
  // conv's NHWC input has the tokens' order but not their shape.
  {
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, {2, 16, 8});
    int t = add1(g, "aten.relu.default", "tokens", {x}, {}, {2, 16, 8});
    t = add1(g, "aten.transpose_copy.int", "t", {t}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}, {2, 8, 16});
    t = add1(g, "aten.view_copy.default", "image", {t}, {{"size", Shape{2, 8, 4, 4}}}, {2, 8, 4, 4});
    const int w = g.add_constant("w", DType::kFloat32, {8, 8, 3, 3}, random(8 * 8 * 9));
    g.set_outputs({add1(g, "aten.convolution.default", "conv", {t, w}, conv_attrs({1, 1}, {1, 1}), {2, 8, 4, 4})});
    EXPECT_NO_THROW(compiler::compile_graph(g, {}));
    engine::EngineDesc d = compiler::compile_to_desc(g, {});
    std::vector<std::string> labels;
    for (const auto& step : d.steps) labels.push_back(step.label);
    EXPECT_EQ(labels, (std::vector<std::string>{"relu", "permute_copy", "conv", "permute_copy"}))
        << "the transpose and the NHWC permute in one kernel";
  }
  // The same for a 1-D conv after [n, l, c] -> [n, c, l] (Conformer).
  {
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, {2, 12, 8});
    int t = add1(g, "aten.relu.default", "seq", {x}, {}, {2, 12, 8});
    t = add1(g, "aten.transpose_copy.int", "t", {t}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}, {2, 8, 12});
    const int w = g.add_constant("w", DType::kFloat32, {8, 8, 3}, random(8 * 8 * 3));
    g.set_outputs({add1(g, "aten.convolution.default", "conv", {t, w}, conv_attrs({1}, {1}), {2, 8, 12})});
    EXPECT_NO_THROW(compiler::compile_graph(g, {}));
  }
  // A GEMM reading rows of 4 from a chain over a [2, 12] storage.
  {
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, {2, 12});
    int t = add1(g, "aten.relu.default", "r", {x}, {}, {2, 12});
    t = add1(g, "aten.view_copy.default", "v", {t}, {{"size", Shape{2, 3, 4}}}, {2, 3, 4});
    t = add1(g, "aten.permute_copy.default", "p1", {t}, {{"dims", Shape{0, 2, 1}}}, {2, 4, 3});
    t = add1(g, "aten.permute_copy.default", "p2", {t}, {{"dims", Shape{0, 2, 1}}}, {2, 3, 4});
    const int w = g.add_constant("w", DType::kFloat32, {5, 4}, random(20));
    g.set_outputs({add1(g, "aten.linear.default", "fc", {t, w}, {}, {2, 3, 5})});
    EXPECT_NO_THROW(compiler::compile_graph(g, {}));
    passes::ExecPlan plan = passes::fuse(g);
    EXPECT_EQ(count_plans(plan, "permute_copy"), 1u) << "one copy, not two permutes";
  }
}

// Functionalized in-place writes (BART's shift_tokens_right: y[:, 1:] =
// x[:, :-1]; y[:, 0] = token): slice_scatter as layout pieces (self around
// the slice, src in it) and copy as a broadcast read of src.
TEST_F(Patchify, SliceScatterAndCopyAreLayoutPieces) {
  const int64_t n = 2, l = 6, c = 3;
  ir::Graph g;
  const int x = g.add_input("x", DType::kFloat32, {n, l, c});
  const int self = g.add_constant("self", DType::kFloat32, {n, l, c}, random(n * l * c));
  const int head = add1(g, "aten.slice_copy.Tensor", "head", {x}, {{"dim", int64_t{1}}, {"start", int64_t{0}},
                        {"end", int64_t{2}}}, {n, 2, c});
  // start -3 is 3: rows 3 and 4 of self replaced by rows 0 and 1 of x.
  const int y = add1(g, "aten.slice_scatter.default", "scatter", {self, head},
                     {{"dim", int64_t{1}}, {"start", int64_t{-3}}, {"end", int64_t{5}}, {"step", int64_t{1}}},
                     {n, l, c});
  const int row = add1(g, "aten.select_copy.int", "row", {x}, {{"dim", int64_t{0}}, {"index", int64_t{1}}}, {l, c});
  const int z = add1(g, "aten.copy.default", "fill", {y, row}, {}, {n, l, c});  // x[1] broadcast over n
  g.set_outputs({y, z});
  const ir::Graph original = g;
  passes::ExecPlan plan = plan_of(g);
  const std::vector<float> xin = floats(random(n * l * c));
  const std::vector<float> base = floats(original.value(self).data);
  std::vector<float> want_y(base), want_z(base.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < l; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const size_t at = static_cast<size_t>((b * l + i) * c + j);
        if (i == 3 || i == 4) want_y[at] = xin[static_cast<size_t>((b * l + i - 3) * c + j)];
        want_z[at] = xin[static_cast<size_t>((l + i) * c + j)];
      }
  expect_close(run_plan(g, plan, xin), want_y);
  ir::Graph second = original;
  second.set_outputs({z});
  passes::ExecPlan plan_z = plan_of(second);
  expect_close(run_plan(second, plan_z, xin), want_z);
}

}  // namespace
}  // namespace kiln
