// Depthwise convolutions as generated kernels (the default), no
// GPU needed: the generated CUDA source (the prelude the engine module
// starts with + the kernel, exactly as lowering makes them) is compiled as
// host C++ through cuda_host_shim.h into a shared library, run on the CPU
// block by block and thread by thread, and compared with a naive depthwise
// conv + epilogue in double. Also: the switch's plan (one kernel step, no
// cuDNN step, no separate activation kernel; NVRTC compiles the module) and
// that with the switch off nothing changes.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "ops/depthwise_kernel.h"
#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "passes/passes.h"

#ifndef KILN_SHIM_HEADER
#error "KILN_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using testing::count_kind;

enum class Epi { kNone, kRelu, kSilu, kHardswish };

struct Case {
  int64_t n, c, h, w, r, s, stride, pad, dilation;
  bool bias;
  Epi epi;
  DType compute;
};

std::string describe(const Case& k) {
  std::ostringstream s;
  s << "n" << k.n << " c" << k.c << " " << k.h << "x" << k.w << " k" << k.r << "x" << k.s << " stride" << k.stride
    << " pad" << k.pad << " dil" << k.dilation << (k.bias ? " bias" : "") << " epi" << static_cast<int>(k.epi) << " "
    << engine::dtype_name(k.compute);
  return s.str();
}

using testing::read_elem;
using testing::round_to;
using testing::write_elem;

int add1(ir::Graph& g, const std::string& op, const std::string& name, std::vector<int> in,
         std::map<std::string, ir::Attr> attrs, DType dtype, std::vector<int64_t> shape) {
  int n = g.add_node(op, name, std::move(in), std::move(attrs), {{dtype, std::move(shape)}});
  return g.nodes()[static_cast<size_t>(n)].outputs[0];
}

int scalar(ir::Graph& g, const std::string& name, float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return g.add_constant(name, DType::kFloat32, {}, b);
}

int64_t out_size(int64_t in, int64_t k, const Case& c) {
  return (in + 2 * c.pad - c.dilation * (k - 1) - 1) / c.stride + 1;
}

// x[n,c,h,w] -> depthwise conv (+bias) -> epilogue, a float32 NCHW graph.
ir::Graph make_graph(const Case& k, std::mt19937& rng, int* weight, int* bias) {
  ir::Graph g;
  const int64_t p = out_size(k.h, k.r, k), q = out_size(k.w, k.s, k);
  const std::vector<int64_t> ys = {k.n, k.c, p, q};
  int x = g.add_input("x", DType::kFloat32, {k.n, k.c, k.h, k.w});
  *weight = g.add_constant("w", DType::kFloat32, {k.c, 1, k.r, k.s},
                           testing::random_float_bytes(static_cast<size_t>(k.c * k.r * k.s), rng));
  std::vector<int> in = {x, *weight};
  *bias = -1;
  if (k.bias) {
    *bias = g.add_constant("b", DType::kFloat32, {k.c}, testing::random_float_bytes(static_cast<size_t>(k.c), rng));
    in.push_back(*bias);
  }
  std::map<std::string, ir::Attr> attrs = {{"stride", std::vector<int64_t>{k.stride, k.stride}},
                                           {"padding", std::vector<int64_t>{k.pad, k.pad}},
                                           {"dilation", std::vector<int64_t>{k.dilation, k.dilation}},
                                           {"transposed", false},
                                           {"output_padding", std::vector<int64_t>{0, 0}},
                                           {"groups", k.c}};
  int y = add1(g, "aten.convolution.default", "dw", in, attrs, DType::kFloat32, ys);
  switch (k.epi) {
    case Epi::kNone: break;
    case Epi::kRelu: y = add1(g, "aten.relu.default", "relu", {y}, {}, DType::kFloat32, ys); break;
    case Epi::kSilu: {
      int sg = add1(g, "aten.sigmoid.default", "sig", {y}, {}, DType::kFloat32, ys);
      y = add1(g, "aten.mul.Tensor", "silu", {y, sg}, {}, DType::kFloat32, ys);
      break;
    }
    case Epi::kHardswish: {
      int a = add1(g, "aten.add.Tensor", "add3", {y, scalar(g, "three", 3.0f)}, {}, DType::kFloat32, ys);
      int cl = add1(g, "aten.clamp.default", "clamp", {a}, {{"min", 0.0}, {"max", 6.0}}, DType::kFloat32, ys);
      int m = add1(g, "aten.mul.Tensor", "mul", {y, cl}, {}, DType::kFloat32, ys);
      y = add1(g, "aten.div.Tensor", "div6", {m, scalar(g, "six", 6.0f)}, {}, DType::kFloat32, ys);
      break;
    }
  }
  g.set_outputs({y});
  return g;
}

double epilogue(Epi e, double v) {
  switch (e) {
    case Epi::kRelu: return v > 0 ? v : 0;
    case Epi::kSilu: return v / (1.0 + std::exp(-v));
    case Epi::kHardswish: return v * std::min(std::max(v + 3.0, 0.0), 6.0) / 6.0;
    default: return v;
  }
}

class DepthwiseKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }

  // Plans `k` with the depthwise pass, runs the generated kernel on the CPU
  // (its own grid, one small block, and misaligned to force the scalar path)
  // and compares with the reference.
  void check(const Case& k, const std::string& tag) {
    SCOPED_TRACE(describe(k) + ", seed " + std::to_string(seed_));
    int w_id = -1, b_id = -1;
    ir::Graph source = make_graph(k, rng_, &w_id, &b_id);
    ir::Graph g = source;
    g.verify();
    passes::fold_constants(g);
    g = passes::fold_batch_norm(g);
    g = passes::to_channels_last(g);
    passes::fold_constants(g);
    g = passes::apply_precision(g, k.compute);
    passes::ExecPlan plan = passes::fuse(g);
    passes::plan_depthwise_kernels(g, plan);
    const passes::PlannedOp* dw = nullptr;
    for (const auto& op : plan.ops) {
      EXPECT_FALSE(op.is<passes::ConvPlan>()) << op.label;
      if (op.is<passes::DepthwisePlan>()) dw = &op;
    }
    ASSERT_NE(dw, nullptr);
    const passes::DepthwisePlan& d = *dw->as<passes::DepthwisePlan>();
    const size_t expect_nodes = k.epi == Epi::kSilu ? 2 : k.epi == Epi::kHardswish ? 4 : 0;
    EXPECT_EQ(d.epilogue.nodes.size(), expect_nodes) << dw->label;
    EXPECT_EQ(d.conv.relu, k.epi == Epi::kRelu);

    ops::DepthwiseKernel gen = ops::generate_depthwise_kernel(g, d, "kiln_dw_test");
    std::string src = testing::host_prelude() + gen.source +
                      "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block) {\n"
                      "  kiln_shim_launch(&kiln_dw_test, args, grid, block);\n}\n";
    void* lib = testing::build_host_module(src, "dw_" + tag, KILN_SHIM_HEADER);
    ASSERT_NE(lib, nullptr);
    using Launch = void (*)(void**, unsigned, unsigned);
    auto launch = reinterpret_cast<Launch>(dlsym(lib, "kiln_test_launch"));
    ASSERT_NE(launch, nullptr);

    const ir::Value& xv = g.value(d.conv.x);
    const ir::Value& ov = g.value(d.out);
    const DType xd = xv.dtype, od = ov.dtype;
    const int64_t p = ov.shape[1], q = ov.shape[2];
    ASSERT_EQ(xv.shape, (std::vector<int64_t>{k.n, k.h, k.w, k.c}));
    ASSERT_EQ(ov.shape, (std::vector<int64_t>{k.n, p, q, k.c}));
    // x: random values exactly representable in its dtype.
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<uint8_t> x_bytes(xv.nbytes());
    std::vector<double> x(static_cast<size_t>(xv.numel()));
    for (size_t i = 0; i < x.size(); ++i) {
      write_elem(xd, x_bytes, i, dist(rng_));
      x[i] = read_elem(xd, x_bytes, i);
    }
    // Reference weights from the NCHW graph, rounded as the precision pass does.
    std::vector<double> wref(static_cast<size_t>(k.c * k.r * k.s)), bref(static_cast<size_t>(k.c), 0.0);
    for (size_t i = 0; i < wref.size(); ++i)
      wref[i] = round_to(xd, read_elem(DType::kFloat32, source.value(w_id).data, i));
    if (k.bias)
      for (size_t i = 0; i < bref.size(); ++i)
        bref[i] = round_to(xd, read_elem(DType::kFloat32, source.value(b_id).data, i));
    std::vector<double> ref(static_cast<size_t>(ov.numel())), mag(ref.size());
    for (int64_t b = 0; b < k.n; ++b)
      for (int64_t i = 0; i < p; ++i)
        for (int64_t j = 0; j < q; ++j)
          for (int64_t c = 0; c < k.c; ++c) {
            double acc = bref[static_cast<size_t>(c)], m = std::fabs(acc);
            for (int64_t u = 0; u < k.r; ++u)
              for (int64_t v = 0; v < k.s; ++v) {
                int64_t h = i * k.stride - k.pad + u * k.dilation, w = j * k.stride - k.pad + v * k.dilation;
                if (h < 0 || h >= k.h || w < 0 || w >= k.w) continue;
                double t = x[static_cast<size_t>(((b * k.h + h) * k.w + w) * k.c + c)] *
                           wref[static_cast<size_t>((c * k.r + u) * k.s + v)];
                acc += t;
                m += std::fabs(t);
              }
            const size_t o = static_cast<size_t>(((b * p + i) * q + j) * k.c + c);
            double conv = k.epi == Epi::kRelu ? epilogue(Epi::kRelu, acc) : acc;
            conv = round_to(xd, conv);  // the conv's stored value
            ref[o] = round_to(od, k.epi == Epi::kRelu ? conv : epilogue(k.epi, conv));
            mag[o] = m;
          }

    // Buffers in argument order; every non-x, non-out operand is a constant.
    const double eps = od == DType::kFloat32 && xd == DType::kFloat32 ? 1e-5
                       : (od == DType::kBFloat16 || xd == DType::kBFloat16) ? 1.0 / 64
                                                                            : 1.0 / 512;
    auto run = [&](unsigned grid, unsigned block, size_t misalign, const std::string& what) {
      SCOPED_TRACE(what);
      // Each buffer 64-byte aligned, x and out then moved by `misalign` elements.
      std::vector<std::vector<uint8_t>> bufs;
      std::vector<void*> ptrs;
      for (int v : gen.tensor_args) {
        const ir::Value& val = g.value(v);
        bufs.emplace_back(val.nbytes() + 128, 0);
        uintptr_t at = (reinterpret_cast<uintptr_t>(bufs.back().data()) + 63) / 64 * 64;
        if (v == d.out || v == d.conv.x) at += misalign * engine::dtype_size(val.dtype);
        void* ptr = reinterpret_cast<void*>(at);
        if (v == d.conv.x) {
          std::memcpy(ptr, x_bytes.data(), x_bytes.size());
        } else if (v != d.out) {
          ASSERT_TRUE(val.is_constant) << val.name;
          std::memcpy(ptr, val.data.data(), val.data.size());
        }
        ptrs.push_back(ptr);
      }
      long long n = gen.n;
      std::vector<void*> args;
      for (void*& ptr : ptrs) args.push_back(&ptr);
      args.push_back(&n);
      launch(args.data(), grid, block);
      std::vector<uint8_t> got(ov.nbytes());
      std::memcpy(got.data(), ptrs[0], got.size());
      size_t bad = 0;
      for (size_t o = 0; o < ref.size(); ++o) {
        const double y = read_elem(od, got, o);
        const double tol = eps * (std::fabs(ref[o]) + 2 * mag[o]) + 1e-7;
        if (!(std::fabs(y - ref[o]) <= tol) && ++bad <= 5)
          ADD_FAILURE() << "element " << o << ": got " << y << ", expected " << ref[o] << " (tol " << tol << ")";
      }
      EXPECT_EQ(bad, 0u);
    };
    ASSERT_EQ(gen.tensor_args[0], d.out);
    run(gen.grid, gen.block, 0, "the lowering's grid");
    // Kernels assume blockDim.x == kDepthwiseBlock (the lowering's block).
    run(1, gen.block, 0, "one block: grid-stride loop");
    if (gen.vector > 1) run(2, gen.block, 1, "x and out misaligned: scalar path");
    dlclose(lib);
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(DepthwiseKernel, Float32MatchesReference) {
  const std::vector<Case> cases = {
      {2, 8, 7, 7, 3, 3, 1, 1, 1, true, Epi::kSilu, DType::kFloat32},        // vector 4
      {1, 6, 9, 8, 5, 5, 2, 2, 1, false, Epi::kHardswish, DType::kFloat32},  // vector 2, stride 2
      {2, 5, 6, 7, 3, 3, 1, 2, 2, true, Epi::kRelu, DType::kFloat32},        // scalar, dilation 2
      {1, 12, 5, 5, 1, 1, 1, 0, 1, true, Epi::kNone, DType::kFloat32},       // 1x1, no epilogue
      {2, 16, 8, 6, 3, 5, 3, 0, 1, true, Epi::kHardswish, DType::kFloat32},  // non-square, stride 3
  };
  for (size_t i = 0; i < cases.size(); ++i) check(cases[i], "f32_" + std::to_string(i));
}

TEST_F(DepthwiseKernel, HalfAndBFloat16MatchReference) {
  const std::vector<Case> cases = {
      {2, 8, 7, 7, 5, 5, 1, 2, 1, true, Epi::kSilu, DType::kFloat16},
      {1, 6, 8, 8, 3, 3, 2, 1, 1, true, Epi::kHardswish, DType::kFloat16},
      {1, 3, 6, 6, 3, 3, 1, 1, 1, false, Epi::kRelu, DType::kFloat16},
      {2, 8, 7, 7, 3, 3, 1, 1, 1, true, Epi::kSilu, DType::kBFloat16},
  };
  for (size_t i = 0; i < cases.size(); ++i) check(cases[i], "lp_" + std::to_string(i));
}

// An fp16 efficientnet block tail: depthwise conv + bias, then SiLU computed
// in float between casts (the decomposition torch.export makes).
ir::Graph efficientnet_like(std::mt19937& rng) {
  ir::Graph g;
  const int64_t n = 2, c = 16, h = 14, w = 14;
  const std::vector<int64_t> ys = {n, c, h, w};
  auto half_bytes = [&](size_t count) {
    std::vector<uint8_t> f = testing::random_float_bytes(count, rng), out(count * 2);
    for (size_t i = 0; i < count; ++i) write_elem(DType::kFloat16, out, i, static_cast<float>(read_elem(DType::kFloat32, f, i)));
    return out;
  };
  int x = g.add_input("x", DType::kFloat16, ys);
  int wt = g.add_constant("w", DType::kFloat16, {c, 1, 5, 5}, half_bytes(static_cast<size_t>(c * 25)));
  int b = g.add_constant("b", DType::kFloat16, {c}, half_bytes(static_cast<size_t>(c)));
  std::map<std::string, ir::Attr> attrs = {{"stride", std::vector<int64_t>{1, 1}},
                                           {"padding", std::vector<int64_t>{2, 2}},
                                           {"dilation", std::vector<int64_t>{1, 1}},
                                           {"transposed", false},
                                           {"output_padding", std::vector<int64_t>{0, 0}},
                                           {"groups", c}};
  int y = add1(g, "aten.convolution.default", "dw", {x, wt, b}, attrs, DType::kFloat16, ys);
  int up = add1(g, "aten._to_copy.default", "up", {y}, {}, DType::kFloat32, ys);
  int sg = add1(g, "aten.sigmoid.default", "sig", {up}, {}, DType::kFloat32, ys);
  int m = add1(g, "aten.mul.Tensor", "mul", {up, sg}, {}, DType::kFloat32, ys);
  int down = add1(g, "aten._to_copy.default", "down", {m}, {}, DType::kFloat16, ys);
  g.set_outputs({down});
  return g;
}

TEST_F(DepthwiseKernel, ConvAndSiluAreOneKernelStepUnlessSwitchedOff) {
  ir::Graph g = efficientnet_like(rng_);
  compiler::CompileOptions off_options, on_options;
  off_options.op_options.depthwise_kernels = false;
  on_options.op_options.depthwise_kernels = true;
  engine::EngineDesc off = compiler::compile_to_desc(g, off_options);
  engine::EngineDesc one = compiler::compile_to_desc(g, on_options);
  engine::EngineDesc on = compiler::compile_to_desc(g, {});  // NVRTC compiles the generated module

  // On is the default, and the engine records the choice.
  ASSERT_EQ(on.steps.size(), one.steps.size());
  for (size_t i = 0; i < on.steps.size(); ++i) EXPECT_EQ(on.steps[i].label, one.steps[i].label);
  EXPECT_EQ(*on.find_metadata("depthwise_kernels"), "true");
  EXPECT_EQ(*off.find_metadata("depthwise_kernels"), "false");
  // Off (0): cuDNN conv+bias, then the SiLU chain as its own kernel.
  EXPECT_EQ(count_kind(off, engine::StepKind::kConv), 1u);
  size_t silu_kernels = 0;
  for (const auto& s : off.steps) silu_kernels += s.label.find("sigmoid") != std::string::npos;
  EXPECT_EQ(silu_kernels, 1u);

  // On: the conv and the chain are exactly one kernel step.
  EXPECT_EQ(count_kind(on, engine::StepKind::kConv), 0u);
  EXPECT_EQ(on.steps.size(), off.steps.size() - 1);
  size_t dw = 0;
  for (const auto& s : on.steps) {
    if (s.label.rfind("dwconv", 0) != 0) {
      EXPECT_EQ(s.label.find("sigmoid"), std::string::npos) << "no separate activation kernel: " << s.label;
      continue;
    }
    ++dw;
    EXPECT_EQ(s.kind, engine::StepKind::kKernel);
    EXPECT_EQ(s.label, "dwconv+_to_copy+sigmoid+mul+_to_copy");
    ASSERT_EQ(s.kernel.args.size(), 5u) << "out, x, weight, bias, n";
    EXPECT_EQ(on.tensors[s.kernel.args[2].tensor].shape, (std::vector<int64_t>{5, 5, 16})) << "[r,s,c] weight";
    EXPECT_EQ(on.tensors[s.kernel.args[0].tensor].dtype, DType::kFloat16);
    EXPECT_EQ(s.kernel.args[4].i64, 2 * 14 * 14 * 16);
  }
  EXPECT_EQ(dw, 1u);
  ASSERT_EQ(on.modules.size(), 1u);
}

// A depthwise conv whose value is also a graph output keeps its epilogue
// separate (the conv value must be stored); grouped non-depthwise convs stay
// on cuDNN.
TEST_F(DepthwiseKernel, SharedValuesAndGroupedConvsAreLeftAlone) {
  ir::Graph g;
  const std::vector<int64_t> ys = {1, 8, 6, 6};
  int x = g.add_input("x", DType::kFloat32, ys);
  int w1 = g.add_constant("w1", DType::kFloat32, {8, 1, 3, 3}, testing::random_float_bytes(72, rng_));
  int w2 = g.add_constant("w2", DType::kFloat32, {8, 2, 3, 3}, testing::random_float_bytes(144, rng_));
  auto attrs = [](int64_t groups) {
    return std::map<std::string, ir::Attr>{{"stride", std::vector<int64_t>{1, 1}},
                                           {"padding", std::vector<int64_t>{1, 1}},
                                           {"dilation", std::vector<int64_t>{1, 1}},
                                           {"transposed", false},
                                           {"output_padding", std::vector<int64_t>{0, 0}},
                                           {"groups", groups}};
  };
  int y = add1(g, "aten.convolution.default", "dw", {x, w1}, attrs(8), DType::kFloat32, ys);
  int s = add1(g, "aten.sigmoid.default", "sig", {y}, {}, DType::kFloat32, ys);
  int z = add1(g, "aten.convolution.default", "grouped", {s, w2}, attrs(4), DType::kFloat32, ys);
  g.set_outputs({y, z});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  EXPECT_EQ(count_kind(d, engine::StepKind::kConv), 1u) << "the grouped conv";
  size_t dw = 0;
  for (const auto& st : d.steps) {
    if (st.label.rfind("dwconv", 0) == 0) {
      ++dw;
      EXPECT_EQ(st.label, "dwconv") << "no epilogue: its value is an output";
    }
  }
  EXPECT_EQ(dw, 1u);
}

}  // namespace
}  // namespace kiln
