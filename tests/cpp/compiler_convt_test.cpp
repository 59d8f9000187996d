// Transposed convolutions, 1-D convolutions and 1-D pooling, no GPU needed.
//
// Numerics: the generated transposed-convolution kernel (the prelude the
// engine module starts with + the kernel, exactly as lowering makes them) is
// compiled as host C++ through cuda_host_shim.h, run on the CPU thread by
// thread and compared with a naive scatter-form reference in double
// (independent of the kernel's gather form) over 1-D and 2-D cases with
// stride, padding, output_padding, dilation, groups, bias, a folded batch
// norm and a fused ReLU, in float32, float16 and bfloat16. A depthwise 1-D
// convolution is run the same way through the depthwise kernel, which checks
// the 1-D -> 2-D rewrite (weight layout and window) numerically.
// Structure: 1-D convolutions become height-1 kiln.conv2d_nhwc steps (cuDNN,
// 1x1 GEMM), 1-D pooling (unsqueeze + 2-D pooling + squeeze) stays
// channels-last, and what the check accepts and refuses.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/conv_transpose_ops.h"
#include "ops/depthwise_kernel.h"
#include "ops/elementwise_kernel.h"
#include "passes/dtype_convert.h"
#include "passes/passes.h"

#ifndef KILN_SHIM_HEADER
#error "KILN_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using testing::count_kind;
using testing::count_label;

// ---- host execution of generated kernels (as in compiler_depthwise_test.cpp)

using testing::host_prelude;
using testing::read_elem;
using testing::round_to;
using testing::write_elem;

std::vector<double> doubles(const ir::Value& v) {
  std::vector<double> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = read_elem(v.dtype, v.data, i);
  return out;
}

using Launch = void (*)(void**, unsigned, unsigned);

// Compiles prelude + `source` (defining `function`) as host C++ against the
// shim; returns the dlopen handle and its launcher.
void* build_host_kernel(const std::string& source, const std::string& function, const std::string& tag,
                        Launch* launch) {
  const std::string launcher = "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block) {\n"
                               "  kiln_shim_launch(&" + function + ", args, grid, block);\n}\n";
  void* handle = testing::build_host_module(host_prelude() + source + launcher, "convt_" + tag, KILN_SHIM_HEADER);
  if (handle) *launch = reinterpret_cast<Launch>(dlsym(handle, "kiln_test_launch"));
  return handle;
}

// Runs a kernel whose parameters are `tensors` (pointers to copies of these
// byte buffers; buffer 0 is the output) then one long long `n`; returns the
// output's bytes.
std::vector<uint8_t> run_kernel(Launch launch, std::vector<std::vector<uint8_t>> tensors, long long n, unsigned grid,
                                unsigned block) {
  std::vector<void*> ptrs;
  for (auto& t : tensors) ptrs.push_back(t.data());
  std::vector<void*> args;
  for (void*& p : ptrs) args.push_back(&p);
  args.push_back(&n);
  launch(args.data(), grid, block);
  return tensors[0];
}

// ---- graph building

int add1(ir::Graph& g, const std::string& op, const std::string& name, std::vector<int> in,
         std::map<std::string, ir::Attr> attrs, std::vector<int64_t> shape, DType dtype = DType::kFloat32) {
  int n = g.add_node(op, name, std::move(in), std::move(attrs), {{dtype, std::move(shape)}});
  return g.nodes()[static_cast<size_t>(n)].outputs[0];
}

std::map<std::string, ir::Attr> conv_attrs(std::vector<int64_t> stride, std::vector<int64_t> pad,
                                           std::vector<int64_t> dilation, std::vector<int64_t> out_pad,
                                           int64_t groups, bool transposed) {
  return {{"stride", stride},         {"padding", pad}, {"dilation", dilation}, {"transposed", transposed},
          {"output_padding", out_pad}, {"groups", groups}};
}

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A batch norm's per-channel parameters (positive variance) and its node.
int add_bn(ir::Graph& g, int x, int64_t k, std::vector<int64_t> shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> pos(0.5f, 2.0f);
  std::vector<float> var(static_cast<size_t>(k));
  for (float& v : var) v = pos(rng);
  int gamma = g.add_constant("bn_w", DType::kFloat32, {k}, testing::random_float_bytes(static_cast<size_t>(k), rng));
  int beta = g.add_constant("bn_b", DType::kFloat32, {k}, testing::random_float_bytes(static_cast<size_t>(k), rng));
  int mean = g.add_constant("bn_m", DType::kFloat32, {k}, testing::random_float_bytes(static_cast<size_t>(k), rng));
  int v = g.add_constant("bn_v", DType::kFloat32, {k}, float_bytes(var));
  int n = g.add_node("aten._native_batch_norm_legit_no_training.default", "bn", {x, gamma, beta, mean, v},
                     {{"momentum", 0.1}, {"eps", 1e-5}},
                     {{DType::kFloat32, shape}, {DType::kFloat32, {0}}, {DType::kFloat32, {0}}});
  return g.nodes()[static_cast<size_t>(n)].outputs[0];
}

// ---- transposed convolution numerics

struct TCase {
  int64_t n, c, k, groups;
  std::vector<int64_t> in, kernel, stride, pad, dilation, out_pad;  // one entry per spatial dim (1-D or 2-D)
  bool bias, bn, relu;
  DType compute;
};

std::string describe(const TCase& t) {
  std::ostringstream s;
  auto list = [&](const char* name, const std::vector<int64_t>& v) {
    s << " " << name;
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "x" : "") << v[i];
  };
  s << t.in.size() << "-D n" << t.n << " c" << t.c << " k" << t.k << " g" << t.groups;
  list("in", t.in);
  list("kernel", t.kernel);
  list("stride", t.stride);
  list("pad", t.pad);
  list("dil", t.dilation);
  list("outpad", t.out_pad);
  s << (t.bias ? " bias" : "") << (t.bn ? " bn" : "") << (t.relu ? " relu" : "") << " "
    << engine::dtype_name(t.compute);
  return s.str();
}

class ConvTranspose : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("KILN_TEST_SEED");
    seed_ = env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::cout << "KILN_TEST_SEED=" << seed_ << "\n";
  }

  void check(const TCase& t, const std::string& tag) {
    SCOPED_TRACE(describe(t) + ", seed " + std::to_string(seed_));
    const size_t d = t.in.size();
    ASSERT_TRUE(d == 1 || d == 2);
    // As 2-D: a 1-D case is height 1.
    auto two = [&](const std::vector<int64_t>& v, int64_t h) { return d == 2 ? v : std::vector<int64_t>{h, v[0]}; };
    const std::vector<int64_t> in2 = two(t.in, 1), ker2 = two(t.kernel, 1), st2 = two(t.stride, 1),
                               pad2 = two(t.pad, 0), dil2 = two(t.dilation, 1), op2 = two(t.out_pad, 0);
    std::vector<int64_t> out2(2), out_sp;
    for (size_t i = 0; i < 2; ++i)
      out2[i] = (in2[i] - 1) * st2[i] - 2 * pad2[i] + dil2[i] * (ker2[i] - 1) + op2[i] + 1;
    for (size_t i = 2 - d; i < 2; ++i) out_sp.push_back(out2[i]);
    const int64_t kg = t.k / t.groups, cg = t.c / t.groups;

    // The NCHW (NCL) graph.
    ir::Graph src;
    std::vector<int64_t> xs = {t.n, t.c}, ws = {t.c, kg}, ys = {t.n, t.k};
    xs.insert(xs.end(), t.in.begin(), t.in.end());
    ws.insert(ws.end(), t.kernel.begin(), t.kernel.end());
    ys.insert(ys.end(), out_sp.begin(), out_sp.end());
    int x = src.add_input("x", DType::kFloat32, xs);
    int64_t wn = 1;
    for (int64_t v : ws) wn *= v;
    int w = src.add_constant("w", DType::kFloat32, ws, testing::random_float_bytes(static_cast<size_t>(wn), rng_));
    std::vector<int> ins = {x, w};
    int b = -1;
    if (t.bias) {
      b = src.add_constant("b", DType::kFloat32, {t.k}, testing::random_float_bytes(static_cast<size_t>(t.k), rng_));
      ins.push_back(b);
    }
    int y = add1(src, "aten.convolution.default", "convt", ins,
                 conv_attrs(t.stride, t.pad, t.dilation, t.out_pad, t.groups, true), ys);
    int bn_node = -1;
    if (t.bn) {
      y = add_bn(src, y, t.k, ys, rng_);
      bn_node = static_cast<int>(src.nodes().size()) - 1;
    }
    if (t.relu) y = add1(src, "aten.relu.default", "relu", {y}, {}, ys);
    src.set_outputs({y});

    // The compiler's passes up to fusion.
    ir::Graph g = src;
    g.verify();
    passes::fold_constants(g);
    g = passes::fold_batch_norm(g);
    g = passes::to_channels_last(g);
    passes::fold_constants(g);
    g = passes::apply_precision(g, t.compute);
    passes::ExecPlan plan = passes::fuse(g);
    const ops::PlannedOp* op = nullptr;
    for (const auto& o : plan.ops)
      if (o.is<ops::ConvTransposePlan>()) {
        ASSERT_EQ(op, nullptr) << "one transposed convolution step";
        op = &o;
      }
    ASSERT_NE(op, nullptr);
    EXPECT_EQ(op->label, t.relu ? "conv_transpose+relu" : "conv_transpose");
    const ops::ConvTransposePlan& cp = *op->as<ops::ConvTransposePlan>();
    EXPECT_EQ(cp.relu, t.relu);
    if (t.bn) EXPECT_GE(cp.bias, 0) << "batch norm folds into the bias";
    if (t.bn && t.compute == DType::kFloat32)
      EXPECT_EQ(plan.ops.size(), 3u) << "permute in, conv_transpose, permute out";

    const ir::Value& xv = g.value(cp.x);
    const ir::Value& ov = g.value(cp.out);
    const DType xd = xv.dtype, od = ov.dtype;
    EXPECT_EQ(xd, t.compute);
    EXPECT_EQ(od, t.compute);
    ASSERT_EQ(xv.shape, (std::vector<int64_t>{t.n, in2[0], in2[1], t.c}));
    ASSERT_EQ(ov.shape, (std::vector<int64_t>{t.n, out2[0], out2[1], t.k}));
    EXPECT_EQ(g.value(cp.w).shape, (std::vector<int64_t>{ker2[0], ker2[1], t.c, kg})) << "[r, s, c, k/groups]";

    ops::ConvTransposeKernel gen = ops::generate_conv_transpose_kernel(g, cp, "kiln_convt_test");
    ASSERT_EQ(gen.n, ov.numel());
    ASSERT_EQ(gen.tensor_args.size(), cp.bias >= 0 ? 4u : 3u);
    ASSERT_EQ(gen.tensor_args[0], cp.out);
    ASSERT_EQ(gen.tensor_args[1], cp.x);
    Launch launch = nullptr;
    void* lib = build_host_kernel(gen.source, "kiln_convt_test", tag, &launch);
    ASSERT_NE(lib, nullptr);
    ASSERT_NE(launch, nullptr);

    // x: random NHWC values exactly representable in its dtype.
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<uint8_t> x_bytes(xv.nbytes());
    std::vector<double> xr(static_cast<size_t>(xv.numel()));
    for (size_t i = 0; i < xr.size(); ++i) {
      write_elem(xd, x_bytes, i, dist(rng_));
      xr[i] = read_elem(xd, x_bytes, i);
    }
    // Reference, scatter form, from the source graph's weights (rounded to the
    // compute dtype unless a batch norm was folded into them).
    std::vector<double> wr = doubles(src.value(w));
    if (!t.bn)
      for (double& v : wr) v = round_to(t.compute, v);
    const int64_t H = in2[0], W = in2[1], R = ker2[0], S = ker2[1], P = out2[0], Q = out2[1];
    std::vector<double> acc(static_cast<size_t>(ov.numel()), 0.0), mag(acc.size(), 0.0);
    for (int64_t bi = 0; bi < t.n; ++bi)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t wi = 0; wi < W; ++wi)
          for (int64_t ci = 0; ci < t.c; ++ci) {
            const double xe = xr[static_cast<size_t>(((bi * H + h) * W + wi) * t.c + ci)];
            for (int64_t kk = 0; kk < kg; ++kk) {
              const int64_t o = (ci / cg) * kg + kk;
              for (int64_t r = 0; r < R; ++r)
                for (int64_t s = 0; s < S; ++s) {
                  const int64_t oh = h * st2[0] - pad2[0] + r * dil2[0], ow = wi * st2[1] - pad2[1] + s * dil2[1];
                  if (oh < 0 || oh >= P || ow < 0 || ow >= Q) continue;
                  const double term = xe * wr[static_cast<size_t>(((ci * kg + kk) * R + r) * S + s)];
                  const size_t at = static_cast<size_t>(((bi * P + oh) * Q + ow) * t.k + o);
                  acc[at] += term;
                  mag[at] += std::fabs(term);
                }
            }
          }
    std::vector<double> bias(static_cast<size_t>(t.k), 0.0), scale(bias.size(), 1.0), shift(bias.size(), 0.0);
    if (t.bias) bias = doubles(src.value(b));
    if (t.bn) {
      const ir::Node& bn = src.nodes()[static_cast<size_t>(bn_node)];
      std::vector<double> gamma = doubles(src.value(bn.inputs[1])), beta = doubles(src.value(bn.inputs[2])),
                          mean = doubles(src.value(bn.inputs[3])), var = doubles(src.value(bn.inputs[4]));
      for (size_t o = 0; o < scale.size(); ++o) {
        scale[o] = gamma[o] / std::sqrt(var[o] + 1e-5);
        shift[o] = beta[o] - mean[o] * scale[o];
      }
    } else if (t.bias) {
      for (double& v : bias) v = round_to(t.compute, v);
    }
    std::vector<double> ref(acc.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const size_t o = i % static_cast<size_t>(t.k);
      double v = (acc[i] + bias[o]) * scale[o] + shift[o];
      mag[i] = (mag[i] + std::fabs(bias[o])) * std::fabs(scale[o]) + std::fabs(shift[o]);
      if (t.relu) v = v > 0 ? v : 0;
      ref[i] = round_to(od, v);
    }

    std::vector<std::vector<uint8_t>> bufs;
    for (int v : gen.tensor_args) {
      const ir::Value& val = g.value(v);
      if (v == cp.out) bufs.emplace_back(val.nbytes(), 0xff);  // NaN-filled: every element must be written
      else if (v == cp.x) bufs.push_back(x_bytes);
      else {
        ASSERT_TRUE(val.is_constant) << val.name;
        bufs.push_back(val.data);
      }
    }
    // fp32: 1e-5 relative to the terms' magnitude; low precision: the
    // rounding of the folded weights and of the stored result.
    const double eps = od == DType::kFloat32 ? 1e-5 : od == DType::kBFloat16 ? 1.0 / 64 : 1.0 / 512;
    double worst = 0;
    for (unsigned grid : {gen.grid, 1u}) {
      SCOPED_TRACE("grid " + std::to_string(grid));
      std::vector<uint8_t> got = run_kernel(launch, bufs, gen.n, grid, gen.block);
      size_t bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double v = read_elem(od, got, i);
        const double err = std::fabs(v - ref[i]);
        const double tol = eps * (std::fabs(ref[i]) + 2 * mag[i]) + 1e-7;
        worst = std::max(worst, err / (std::fabs(ref[i]) + mag[i] + 1e-30));
        if (!(err <= tol) && ++bad <= 5)
          ADD_FAILURE() << "element " << i << ": got " << v << ", expected " << ref[i] << " (tol " << tol << ")";
      }
      EXPECT_EQ(bad, 0u);
    }
    std::cout << "[ convt ] " << describe(t) << ": max |err| / (|ref| + sum|terms|) = " << worst << "\n";
    dlclose(lib);
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(ConvTranspose, Float32MatchesReference) {
  const std::vector<TCase> cases = {
      // 2-D, stride 2, padding 1, output_padding 1 (the usual decoder upsampling)
      {2, 8, 4, 1, {5, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, true, false, false, DType::kFloat32},
      // 2-D grouped, non-square, dilation, ReLU fused
      {1, 6, 9, 3, {4, 5}, {3, 2}, {2, 3}, {1, 0}, {2, 1}, {1, 2}, true, false, true, DType::kFloat32},
      // 2-D stride 1 (a plain full correlation), no bias
      {2, 5, 3, 1, {4, 4}, {3, 3}, {1, 1}, {0, 0}, {1, 1}, {0, 0}, false, false, false, DType::kFloat32},
      // 1-D grouped with dilation, stride 2
      {2, 8, 6, 2, {20}, {3}, {2}, {1}, {2}, {0}, true, false, false, DType::kFloat32},
      // 1-D depthwise-like (groups == c), stride 4, kernel 8 (wav upsampler)
      {1, 4, 4, 4, {9}, {8}, {4}, {2}, {1}, {0}, true, false, true, DType::kFloat32},
      // batch norm folded, k == c (the weight's first dim is the input channel)
      {2, 6, 6, 1, {5, 5}, {4, 4}, {2, 2}, {1, 1}, {1, 1}, {0, 0}, true, true, true, DType::kFloat32},
      // batch norm folded into a grouped 1-D one
      {1, 4, 6, 2, {7}, {3}, {2}, {1}, {1}, {1}, false, true, false, DType::kFloat32},
  };
  for (size_t i = 0; i < cases.size(); ++i) check(cases[i], "f32_" + std::to_string(i));
}

TEST_F(ConvTranspose, HalfAndBFloat16MatchReference) {
  const std::vector<TCase> cases = {
      {2, 8, 4, 1, {5, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, true, false, true, DType::kFloat16},
      {2, 8, 6, 2, {20}, {3}, {2}, {1}, {2}, {0}, true, false, false, DType::kFloat16},
      {1, 6, 9, 3, {4, 5}, {3, 2}, {2, 3}, {1, 0}, {2, 1}, {1, 2}, true, false, false, DType::kBFloat16},
      {2, 6, 6, 1, {5, 5}, {4, 4}, {2, 2}, {1, 1}, {1, 1}, {0, 0}, true, true, true, DType::kBFloat16},
  };
  for (size_t i = 0; i < cases.size(); ++i) check(cases[i], "lp_" + std::to_string(i));
}

// The whole pipeline: a 2-D decoder (conv, transposed conv + ReLU, conv)
// compiles (NVRTC) with one kernel step for the transposed conv, channels-last
// throughout.
TEST_F(ConvTranspose, CompilesChannelsLastBetweenConvs) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {1, 4, 6, 6});
  int w1 = g.add_constant("w1", DType::kFloat32, {8, 4, 3, 3}, testing::random_float_bytes(288, rng_));
  int wt = g.add_constant("wt", DType::kFloat32, {8, 4, 4, 4}, testing::random_float_bytes(512, rng_));
  int w2 = g.add_constant("w2", DType::kFloat32, {2, 4, 3, 3}, testing::random_float_bytes(72, rng_));
  int y = add1(g, "aten.convolution.default", "c1", {x, w1}, conv_attrs({1, 1}, {1, 1}, {1, 1}, {0, 0}, 1, false),
               {1, 8, 6, 6});
  y = add1(g, "aten.convolution.default", "up", {y, wt}, conv_attrs({2, 2}, {1, 1}, {1, 1}, {0, 0}, 1, true),
           {1, 4, 12, 12});
  y = add1(g, "aten.relu.default", "relu", {y}, {}, {1, 4, 12, 12});
  y = add1(g, "aten.convolution.default", "c2", {y, w2}, conv_attrs({1, 1}, {1, 1}, {1, 1}, {0, 0}, 1, false),
           {1, 2, 12, 12});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(count_label(d, "permute_copy"), 2u) << "only the engine edges";
  EXPECT_EQ(count_kind(d, engine::StepKind::kConv), 2u);
  ASSERT_EQ(count_label(d, "conv_transpose+relu"), 1u);
  for (const auto& s : d.steps) {
    if (s.label != "conv_transpose+relu") continue;
    EXPECT_EQ(s.kind, engine::StepKind::kKernel);
    ASSERT_EQ(s.kernel.args.size(), 4u) << "out, x, weight, n";
    EXPECT_EQ(d.tensors[s.kernel.args[0].tensor].shape, (std::vector<int64_t>{1, 12, 12, 4}));
    EXPECT_EQ(d.tensors[s.kernel.args[2].tensor].shape, (std::vector<int64_t>{4, 4, 8, 4}));
    EXPECT_EQ(s.kernel.args[3].i64, 12 * 12 * 4);
  }
  ASSERT_EQ(d.modules.size(), 1u);
}

// ---- 1-D convolutions and pooling

TEST_F(ConvTranspose, Conv1dIsAHeightOneConv) {
  const int64_t n = 2, c = 6, l = 20, k = 8;
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {n, c, l});
  int w1 = g.add_constant("w1", DType::kFloat32, {k, c / 2, 3}, testing::random_float_bytes(k * c / 2 * 3, rng_));
  int b1 = g.add_constant("b1", DType::kFloat32, {k}, testing::random_float_bytes(k, rng_));
  int w2 = g.add_constant("w2", DType::kFloat32, {k, k, 5}, testing::random_float_bytes(k * k * 5, rng_));
  int w3 = g.add_constant("w3", DType::kFloat32, {4, k, 1}, testing::random_float_bytes(4 * k, rng_));
  int y = add1(g, "aten.convolution.default", "c1", {x, w1, b1}, conv_attrs({2}, {1}, {1}, {0}, 2, false), {n, k, 10});
  y = add1(g, "aten.relu.default", "relu", {y}, {}, {n, k, 10});
  y = add1(g, "aten.convolution.default", "c2", {y, w2}, conv_attrs({1}, {4}, {2}, {0}, 1, false), {n, k, 10});
  int s = add1(g, "aten.sigmoid.default", "sig", {y}, {}, {n, k, 10});
  y = add1(g, "aten.mul.Tensor", "silu", {y, s}, {}, {n, k, 10});
  y = add1(g, "aten.convolution.default", "c3", {y, w3}, conv_attrs({1}, {0}, {1}, {0}, 1, false), {n, 4, 10});
  int m = add1(g, "aten.mean.dim", "mean", {y}, {{"dim", std::vector<int64_t>{-1}}, {"keepdim", false}}, {n, 4});
  g.set_outputs({y, m});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(count_label(d, "permute_copy"), 2u) << "in, and the [n, k, l] output";
  ASSERT_EQ(count_kind(d, engine::StepKind::kConv), 2u);
  EXPECT_EQ(count_label(d, "conv+bias+relu"), 0u) << "the bias is the conv's own";
  EXPECT_EQ(count_label(d, "conv+relu"), 1u);
  EXPECT_EQ(count_label(d, "conv(1x1 gemm)"), 1u);
  EXPECT_EQ(count_label(d, "mean"), 1u) << "the mean reads the channels-last value";
  const engine::ConvStep* c1 = nullptr;
  const engine::ConvStep* c2 = nullptr;
  for (const auto& st : d.steps)
    if (st.kind == engine::StepKind::kConv) (c1 ? c2 : c1) = &st.conv;
  ASSERT_TRUE(c1 && c2);
  EXPECT_EQ(c1->h, 1);
  EXPECT_EQ(c1->w_in, l);
  EXPECT_EQ(c1->c, c);
  EXPECT_EQ(c1->k, k);
  EXPECT_EQ(c1->r, 1);
  EXPECT_EQ(c1->s, 3);
  EXPECT_EQ(c1->p, 1);
  EXPECT_EQ(c1->q, 10);
  EXPECT_EQ(c1->pad_h, 0);
  EXPECT_EQ(c1->pad_w, 1);
  EXPECT_EQ(c1->stride_h, 1);
  EXPECT_EQ(c1->stride_w, 2);
  EXPECT_EQ(c1->dilation_h, 1);
  EXPECT_EQ(c1->groups, 2);
  EXPECT_NE(c1->bias, engine::kNoTensor);
  EXPECT_EQ(c1->activation, engine::ConvActivation::kRelu);
  EXPECT_EQ(c2->pad_w, 4);
  EXPECT_EQ(c2->dilation_w, 2);
  EXPECT_EQ(c2->dilation_h, 1);
  // The weight is OHWI [k, 1, r, c/groups]: w'[o][0][j][i] = w[o][i][j].
  const engine::TensorDesc& wt = d.tensors[c1->w];
  ASSERT_EQ(wt.shape, (std::vector<int64_t>{k, 1, 3, c / 2}));
  std::vector<float> orig(static_cast<size_t>(k * c / 2 * 3)), got(orig.size());
  std::memcpy(orig.data(), g.value(w1).data.data(), orig.size() * 4);
  std::memcpy(got.data(), d.weights.data() + wt.offset, got.size() * 4);
  for (int64_t o = 0; o < k; ++o)
    for (int64_t i = 0; i < c / 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        ASSERT_EQ(got[static_cast<size_t>((o * 3 + j) * (c / 2) + i)], orig[static_cast<size_t>((o * (c / 2) + i) * 3 + j)]);
}

// A depthwise 1-D conv runs the depthwise kernel; run on the CPU it matches a
// naive NCL conv1d (so the 1-D -> 2-D rewrite's window and weight are right).
TEST_F(ConvTranspose, DepthwiseConv1dMatchesReference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t n = 2, c = 8, l = 17, r = 5, pad = 4, dil = 2, stride = 2;
  const int64_t q = (l + 2 * pad - dil * (r - 1) - 1) / stride + 1;
  ir::Graph src;
  int x = src.add_input("x", DType::kFloat32, {n, c, l});
  int w = src.add_constant("w", DType::kFloat32, {c, 1, r}, testing::random_float_bytes(c * r, rng_));
  int b = src.add_constant("b", DType::kFloat32, {c}, testing::random_float_bytes(c, rng_));
  int y = add1(src, "aten.convolution.default", "dw", {x, w, b}, conv_attrs({stride}, {pad}, {dil}, {0}, c, false),
               {n, c, q});
  y = add1(src, "aten.relu.default", "relu", {y}, {}, {n, c, q});
  src.set_outputs({y});
  ir::Graph g = src;
  passes::fold_constants(g);
  g = passes::to_channels_last(g);
  passes::fold_constants(g);
  passes::ExecPlan plan = passes::fuse(g);
  passes::plan_depthwise_kernels(g, plan);
  const ops::DepthwisePlan* dp = nullptr;
  for (const auto& op : plan.ops)
    if (op.is<ops::DepthwisePlan>()) dp = op.as<ops::DepthwisePlan>();
  ASSERT_NE(dp, nullptr);
  EXPECT_TRUE(dp->conv.relu);
  ASSERT_EQ(g.value(dp->conv.x).shape, (std::vector<int64_t>{n, 1, l, c}));
  ops::DepthwiseKernel gen = ops::generate_depthwise_kernel(g, *dp, "kiln_dw1d_test");
  Launch launch = nullptr;
  void* lib = build_host_kernel(gen.source, "kiln_dw1d_test", "dw1d", &launch);
  ASSERT_TRUE(lib && launch);
  std::vector<uint8_t> xb = testing::random_float_bytes(static_cast<size_t>(n * l * c), rng_);  // NLC
  std::vector<std::vector<uint8_t>> bufs;
  for (int v : gen.tensor_args) {
    if (v == dp->out) bufs.emplace_back(g.value(v).nbytes(), 0xff);
    else if (v == dp->conv.x) bufs.push_back(xb);
    else bufs.push_back(g.value(v).data);
  }
  std::vector<uint8_t> got = run_kernel(launch, bufs, gen.n, gen.grid, gen.block);
  std::vector<double> wr = doubles(src.value(w)), br = doubles(src.value(b)), xr(static_cast<size_t>(n * l * c));
  for (size_t i = 0; i < xr.size(); ++i) xr[i] = read_elem(DType::kFloat32, xb, i);
  for (int64_t bi = 0; bi < n; ++bi)
    for (int64_t j = 0; j < q; ++j)
      for (int64_t ch = 0; ch < c; ++ch) {
        double acc = br[static_cast<size_t>(ch)], mag = std::fabs(acc);
        for (int64_t t = 0; t < r; ++t) {
          const int64_t pos = j * stride - pad + t * dil;
          if (pos < 0 || pos >= l) continue;
          const double term = xr[static_cast<size_t>((bi * l + pos) * c + ch)] * wr[static_cast<size_t>(ch * r + t)];
          acc += term;
          mag += std::fabs(term);
        }
        const double ref = acc > 0 ? acc : 0;
        const double v = read_elem(DType::kFloat32, got, static_cast<size_t>((bi * q + j) * c + ch));
        ASSERT_NEAR(v, ref, 1e-5 * (std::fabs(ref) + mag) + 1e-7) << "n " << bi << " l " << j << " c " << ch;
      }
  dlclose(lib);
}

// F.max_pool1d / F.avg_pool1d / F.adaptive_avg_pool1d export as unsqueeze,
// 2-D pooling, squeeze: between 1-D convolutions they stay channels-last.
TEST_F(ConvTranspose, Pool1dStaysChannelsLastBetweenConv1ds) {
  const int64_t n = 2, c = 8, l = 20;
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {n, c, l});
  int w1 = g.add_constant("w1", DType::kFloat32, {c, c, 3}, testing::random_float_bytes(c * c * 3, rng_));
  int w2 = g.add_constant("w2", DType::kFloat32, {c, c, 3}, testing::random_float_bytes(c * c * 3, rng_));
  int y = add1(g, "aten.convolution.default", "c1", {x, w1}, conv_attrs({1}, {1}, {1}, {0}, 1, false), {n, c, l});
  y = add1(g, "aten.unsqueeze_copy.default", "u1", {y}, {{"dim", int64_t{-2}}}, {n, c, 1, l});
  int mp = g.add_node("aten.max_pool2d_with_indices.default", "mp", {y},
                      {{"kernel_size", std::vector<int64_t>{1, 3}}, {"stride", std::vector<int64_t>{1, 2}},
                       {"padding", std::vector<int64_t>{0, 1}}, {"dilation", std::vector<int64_t>{1, 1}},
                       {"ceil_mode", false}},
                      {{DType::kFloat32, {n, c, 1, 10}}, {DType::kInt64, {n, c, 1, 10}}});
  y = g.nodes()[static_cast<size_t>(mp)].outputs[0];
  y = add1(g, "aten.squeeze_copy.dims", "s1", {y}, {{"dim", std::vector<int64_t>{-2}}}, {n, c, 10});
  y = add1(g, "aten.unsqueeze_copy.default", "u2", {y}, {{"dim", int64_t{-2}}}, {n, c, 1, 10});
  y = add1(g, "aten.avg_pool2d.default", "ap", {y},
           {{"kernel_size", std::vector<int64_t>{1, 2}}, {"stride", std::vector<int64_t>{1, 2}},
            {"padding", std::vector<int64_t>{0, 0}}, {"ceil_mode", false}, {"count_include_pad", true}},
           {n, c, 1, 5});
  y = add1(g, "aten.squeeze_copy.dims", "s2", {y}, {{"dim", std::vector<int64_t>{-2}}}, {n, c, 5});
  y = add1(g, "aten.convolution.default", "c2", {y, w2}, conv_attrs({1}, {1}, {1}, {0}, 1, false), {n, c, 5});
  y = add1(g, "aten.unsqueeze_copy.default", "u3", {y}, {{"dim", int64_t{-2}}}, {n, c, 1, 5});
  y = add1(g, "aten._adaptive_avg_pool2d.default", "aap", {y}, {{"output_size", std::vector<int64_t>{1, 2}}},
           {n, c, 1, 2});
  y = add1(g, "aten.squeeze_copy.dims", "s3", {y}, {{"dim", std::vector<int64_t>{-2}}}, {n, c, 2});
  g.set_outputs({y});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  std::vector<std::string> labels;
  for (const auto& s : d.steps) labels.push_back(s.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"permute_copy", "conv", "max_pool2d_nhwc", "avg_pool2d_nhwc", "conv",
                                              "adaptive_avg_pool2d_nhwc", "permute_copy"}));
}

// ---- the capability check

TEST(ConvTransposeSupport, AcceptsAndRefuses) {
  compiler::OpQuery q;
  q.op = "aten.convolution.default";
  // ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
  q.inputs = {{DType::kFloat32, {2, 8, 5, 6}, false}, {DType::kFloat32, {8, 4, 3, 3}, true},
              {DType::kFloat32, {4}, true}};
  q.outputs = {{DType::kFloat32, {2, 4, 10, 12}, false}};
  q.attrs = conv_attrs({2, 2}, {1, 1}, {1, 1}, {1, 1}, 1, true);
  EXPECT_FALSE(compiler::check_support(q).has_value());
  // groups: the weight's first dim is the input channels
  q.attrs["groups"] = int64_t{2};
  q.outputs = {{DType::kFloat32, {2, 8, 10, 12}, false}};
  q.inputs[2].shape = {8};
  EXPECT_FALSE(compiler::check_support(q).has_value());
  q.attrs["groups"] = int64_t{3};
  auto why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("groups"), std::string::npos) << *why;
  q.attrs["groups"] = int64_t{1};
  q.inputs[2].shape = {4};
  q.outputs = {{DType::kFloat32, {2, 4, 10, 12}, false}};
  // output_padding must be smaller than the stride or the dilation
  q.attrs["output_padding"] = std::vector<int64_t>{2, 2};
  q.outputs = {{DType::kFloat32, {2, 4, 11, 13}, false}};
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("output_padding"), std::string::npos) << *why;

  // ConvTranspose1d(8, 6, 3, stride=2, padding=1, groups=2, dilation=2)
  q.inputs = {{DType::kFloat32, {2, 8, 20}, false}, {DType::kFloat32, {8, 3, 3}, true}};
  q.outputs = {{DType::kFloat32, {2, 6, 41}, false}};
  q.attrs = conv_attrs({2}, {1}, {2}, {0}, 2, true);
  EXPECT_FALSE(compiler::check_support(q).has_value());
  q.outputs = {{DType::kFloat32, {2, 6, 40}, false}};
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value()) << "output length does not match";
  // Conv1d(8, 16, 3, padding=1)
  q.inputs = {{DType::kFloat32, {2, 8, 20}, false}, {DType::kFloat32, {16, 8, 3}, true}};
  q.outputs = {{DType::kFloat32, {2, 16, 20}, false}};
  q.attrs = conv_attrs({1}, {1}, {1}, {0}, 1, false);
  EXPECT_FALSE(compiler::check_support(q).has_value());
  q.attrs["stride"] = std::vector<int64_t>{1, 1};
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("1-D convolution stride"), std::string::npos) << *why;
  // 3-D convolutions are not taken
  q.inputs = {{DType::kFloat32, {1, 2, 4, 4, 4}, false}, {DType::kFloat32, {2, 2, 1, 1, 1}, true}};
  q.outputs = {{DType::kFloat32, {1, 2, 4, 4, 4}, false}};
  q.attrs = conv_attrs({1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0}, 1, false);
  why = compiler::check_support(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("1-D and 2-D"), std::string::npos) << *why;
}

}  // namespace
}  // namespace kiln
