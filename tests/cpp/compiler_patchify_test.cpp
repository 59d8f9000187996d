// Layout kernels reading through the chain of permutes, views, slices and
// selects before them (ops/layout_ops.cpp), no GPU needed: the step plan is
// run by a small interpreter here (layout pieces through their affine maps,
// GEMMs as loops) and compared with references written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
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

class LayoutChain : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  std::vector<uint8_t> random(int64_t count) { return testing::random_float_bytes(static_cast<size_t>(count), rng_); }

    unsigned seed_ = 0;
  std::mt19937 rng_;
};

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

}  // namespace
}  // namespace kiln
