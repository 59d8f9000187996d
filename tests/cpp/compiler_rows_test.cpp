// Row ops (softmax / log_softmax, the safe-softmax chain, RMSNorm), no GPU
// needed: the graph goes through the compiler's passes up to fusion, the
// one generated kernel (the engine module's prelude + the kernel, as
// lowering makes them) is compiled as host C++ through cuda_block_shim.h
// (each block's threads as cooperating fibers) and its output is compared
// with the op's definition computed in double from the same inputs.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/norm_kernel.h"
#include "ops/norm_ops.h"
#include "ops/softmax_kernel.h"
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
using Attrs = std::map<std::string, ir::Attr>;
constexpr double kInf = std::numeric_limits<double>::infinity();

using testing::out0;


// softmax / log_softmax over `dim` of a contiguous `shape`, in double; safe:
// rows of -inf give 0.
std::vector<double> softmax_ref(const std::vector<double>& x, const std::vector<int64_t>& shape, int64_t dim,
                                bool log, bool safe) {
  int64_t outer = 1, inner = 1;
  const int64_t L = shape[static_cast<size_t>(dim)];
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) outer *= shape[static_cast<size_t>(d)];
    if (d > dim) inner *= shape[static_cast<size_t>(d)];
  }
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t e) { return static_cast<size_t>((o * L + e) * inner + i); };
      double m = -kInf, s = 0;
      for (int64_t e = 0; e < L; ++e) m = std::max(m, x[at(e)]);
      for (int64_t e = 0; e < L; ++e) s += std::exp(x[at(e)] - m);
      for (int64_t e = 0; e < L; ++e)
        y[at(e)] = safe && m == -kInf ? 0.0 : log ? x[at(e)] - m - std::log(s) : std::exp(x[at(e)] - m) / s;
    }
  return y;
}

struct Case {
  std::string name;
  ir::Graph graph;
  int x = -1;
  std::function<std::vector<double>(const std::vector<double>&, const ir::Graph&)> reference;
  std::string label;        // the one step fusion must make
  double masked = 0.0;      // fraction of inputs set to -inf
  std::vector<int64_t> masked_rows;  // rows (of the last dim) set all to -inf
  int64_t threads_per_row = 0;
};

Case softmax_case(const std::string& name, std::vector<int64_t> shape, int64_t dim, bool log, DType dtype) {
  Case c;
  c.name = name;
  c.x = c.graph.add_input("x", dtype, shape);
  int n = c.graph.add_node(log ? "aten._log_softmax.default" : "aten._softmax.default", "sm", {c.x},
                           {{"dim", dim}, {"half_to_float", false}}, {{dtype, shape}});
  c.graph.set_outputs({out0(c.graph, n)});
  const int64_t d = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
  c.reference = [shape, d, log](const std::vector<double>& x, const ir::Graph&) {
    return softmax_ref(x, shape, d, log, false);
  };
  c.label = log ? "log_softmax" : "softmax";
  return c;
}

// The chain torch.export writes around _softmax for attention.
Case safe_case(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  Case c;
  c.name = name;
  ir::Graph& g = c.graph;
  c.x = g.add_input("x", dtype, shape);
  std::vector<int64_t> kept = shape;
  kept.back() = 1;
  int sm = out0(g, g.add_node("aten._softmax.default", "sm", {c.x}, {{"dim", int64_t{-1}}, {"half_to_float", false}},
                              {{dtype, shape}}));
  int eq = out0(g, g.add_node("aten.eq.Scalar", "eq", {c.x}, {{"other", -kInf}}, {{DType::kBool, shape}}));
  int n1 = out0(g, g.add_node("aten.logical_not.default", "not1", {eq}, {}, {{DType::kBool, shape}}));
  int any = out0(g, g.add_node("aten.any.dim", "any", {n1}, {{"dim", int64_t{-1}}, {"keepdim", true}},
                               {{DType::kBool, kept}}));
  int n2 = out0(g, g.add_node("aten.logical_not.default", "not2", {any}, {}, {{DType::kBool, kept}}));
  int full = out0(g, g.add_node("aten.full_like.default", "full", {sm}, {{"fill_value", 0.0}}, {{dtype, shape}}));
  int w = out0(g, g.add_node("aten.where.self", "where", {n2, full, sm}, {}, {{dtype, shape}}));
  g.set_outputs({w});
  const int64_t d = static_cast<int64_t>(shape.size()) - 1;
  c.reference = [shape, d](const std::vector<double>& x, const ir::Graph&) {
    return softmax_ref(x, shape, d, false, true);
  };
  c.label = "safe_softmax";
  return c;
}

// Rows of a wider tensor: the normalized rows are columns [start, start + heads * D) of x's
// last dim (width `width`), viewed as `heads` rows of D, as Qwen3's per-head q/k norms read the
// merged q|k|v projection.
struct Sliced {
  int64_t width = 0, start = 0, heads = 0;
};

// HF Llama's RMSNorm: [cast to f32] pow 2, mean(-1), add eps, rsqrt, mul,
// [cast back], mul by the weight (on the left or the right).
Case rms_case(const std::string& name, std::vector<int64_t> shape, DType dtype, bool casts, bool scalar_eps,
              bool weight_left, std::mt19937& rng, Sliced sliced = {}) {
  Case c;
  c.name = name;
  ir::Graph& g = c.graph;
  const int64_t D = shape.back();
  const double eps = 1e-5;
  int rows = -1;  // what the pattern normalizes
  if (sliced.heads > 0) {
    std::vector<int64_t> merged(shape.begin(), shape.end() - 2);  // shape is [..., heads, D]
    merged.push_back(sliced.width);
    c.x = g.add_input("x", dtype, merged);
    const int cols = testing::slice_last(g, c.x, sliced.start, sliced.start + sliced.heads * D);
    rows = out0(g, g.add_node("aten.view_copy.default", "heads", {cols}, {{"size", shape}}, {{dtype, shape}}));
  } else {
    c.x = rows = g.add_input("x", dtype, shape);
  }
  std::vector<int64_t> kept = shape;
  kept.back() = 1;
  const DType f = casts ? DType::kFloat32 : dtype;
  int a = casts ? out0(g, g.add_node("aten._to_copy.default", "up", {rows}, {}, {{f, shape}})) : rows;
  int sq = out0(g, g.add_node("aten.pow.Tensor_Scalar", "sq", {a}, {{"exponent", int64_t{2}}}, {{f, shape}}));
  int mean = out0(g, g.add_node("aten.mean.dim", "mean", {sq}, {{"dim", std::vector<int64_t>{-1}}, {"keepdim", true}},
                                {{f, kept}}));
  int add;
  if (scalar_eps) {
    add = out0(g, g.add_node("aten.add.Scalar", "add", {mean}, {{"other", eps}}, {{f, kept}}));
  } else {
    std::vector<uint8_t> bytes(4);
    const float e = static_cast<float>(eps);
    std::memcpy(bytes.data(), &e, 4);
    int k = g.add_constant("eps", DType::kFloat32, {}, bytes);
    add = out0(g, g.add_node("aten.add.Tensor", "add", {mean, k}, {}, {{f, kept}}));
  }
  int r = out0(g, g.add_node("aten.rsqrt.default", "rsqrt", {add}, {}, {{f, kept}}));
  int y = out0(g, g.add_node("aten.mul.Tensor", "mul", {a, r}, {}, {{f, shape}}));
  if (casts) y = out0(g, g.add_node("aten._to_copy.default", "down", {y}, {}, {{dtype, shape}}));
  int w = g.add_constant("w", dtype, {D}, testing::random_elems(dtype, D, rng, 0.5f, 1.5f));
  std::vector<int> operands = weight_left ? std::vector<int>{w, y} : std::vector<int>{y, w};
  int out = out0(g, g.add_node("aten.mul.Tensor", "scale", operands, {}, {{dtype, shape}}));
  g.set_outputs({out});
  const int64_t count = ir::numel_of(shape);
  c.reference = [D, eps, w, count, sliced](const std::vector<double>& x, const ir::Graph& planned) {
    const ir::Value& wv = planned.value(w);
    // Element e of normalized row r: x itself, or the row's columns of the wider x.
    auto at = [&](size_t r, int64_t e) {
      if (sliced.heads == 0) return x[r * D + e];
      const size_t t = r / static_cast<size_t>(sliced.heads), h = r % static_cast<size_t>(sliced.heads);
      return x[t * sliced.width + static_cast<size_t>(sliced.start) + h * D + e];
    };
    std::vector<double> y(static_cast<size_t>(count));
    for (size_t row = 0; row < y.size() / static_cast<size_t>(D); ++row) {
      double ss = 0;
      for (int64_t e = 0; e < D; ++e) ss += at(row, e) * at(row, e);
      const double rs = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
      for (int64_t e = 0; e < D; ++e)
        y[row * D + e] = at(row, e) * rs * read_elem(wv.dtype, wv.data, static_cast<size_t>(e));
    }
    return y;
  };
  c.label = "rms_norm";
  return c;
}

class RowKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }

  void check(Case c) {
    SCOPED_TRACE(c.name + ", seed " + std::to_string(seed_));
    ir::Graph g = c.graph;
    g.verify();
    passes::ExecPlan plan = passes::fuse(g);
    ASSERT_EQ(plan.ops.size(), 1u) << "one step; the first is " << plan.ops[0].label;
    EXPECT_EQ(plan.ops[0].label, c.label);
    std::string source;
    unsigned grid = 0, block = 0;
    int64_t vector = 1;
    int weight = -1, out = -1;
    if (const auto* p = plan.ops[0].as<ops::SoftmaxPlan>()) {
      ops::SoftmaxKernel gen = ops::generate_softmax_kernel(g, *p, "kiln_row_test", c.threads_per_row);
      source = gen.source;
      grid = gen.launch.grid;
      block = gen.launch.block_x * gen.launch.block_y;
      vector = gen.launch.vector;
      out = p->out;
      EXPECT_EQ(p->input, c.x);
    } else if (const auto* r = plan.ops[0].as<ops::RmsNormPlan>()) {
      ops::NormKernel gen = ops::generate_norm_kernel(g, r->norm, "kiln_row_test", c.threads_per_row, 0, true);
      source = gen.source;
      grid = gen.launch.grid;
      block = gen.launch.block;
      vector = gen.launch.vector;
      weight = r->norm.weight;
      out = r->norm.out;
      EXPECT_EQ(r->norm.input, c.x) << "reads x past the widening cast";
    } else {
      FAIL() << "unexpected step " << plan.ops[0].label;
    }
    std::string src = testing::host_prelude() + source +
                      "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block, int high) {\n"
                      "  kiln_shim_launch_blocks(&kiln_row_test, args, grid, block,\n"
                      "      high ? kiln_shim::Order::kHighWarpFirst : kiln_shim::Order::kLowWarpFirst);\n}\n";
    void* lib = testing::build_host_module(src, "rows_" + c.name, KILN_BLOCK_SHIM_HEADER);
    ASSERT_NE(lib, nullptr);
    using Launch = void (*)(void**, unsigned, unsigned, int);
    auto launch = reinterpret_cast<Launch>(dlsym(lib, "kiln_test_launch"));
    ASSERT_NE(launch, nullptr);

    const ir::Value& xv = g.value(c.x);
    const ir::Value& ov = g.value(out);
    std::vector<uint8_t> x_bytes = testing::random_elems(xv.dtype, xv.numel(), rng_, -4.0f, 4.0f);
    std::bernoulli_distribution mask(c.masked);
    const int64_t last = xv.shape.back();
    for (size_t i = 0; i < static_cast<size_t>(xv.numel()); ++i) {
      const int64_t row = static_cast<int64_t>(i) / last;
      const bool whole = std::find(c.masked_rows.begin(), c.masked_rows.end(), row) != c.masked_rows.end();
      if (whole || (c.masked > 0 && mask(rng_))) write_elem(xv.dtype, x_bytes, i, -INFINITY);
    }
    std::vector<double> x(static_cast<size_t>(xv.numel()));
    for (size_t i = 0; i < x.size(); ++i) x[i] = read_elem(xv.dtype, x_bytes, i);
    std::vector<double> ref = c.reference(x, g);
    for (double& r : ref) r = round_to(ov.dtype, r);
    const double tol = ov.dtype == DType::kFloat32 ? 2e-5 : ov.dtype == DType::kFloat16 ? 1.0 / 512 : 1.0 / 64;

    auto run = [&](unsigned blocks, bool high, size_t misalign, const std::string& what) {
      SCOPED_TRACE(what);
      constexpr size_t kGuard = 64;
      std::vector<uint8_t> out_buf(ov.nbytes() + 2 * kGuard + 128, 0xA5), in_buf(x_bytes.size() + 128);
      auto aligned = [](std::vector<uint8_t>& b, size_t at) {
        return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(b.data()) + at + 63) / 64 * 64);
      };
      uint8_t* o = aligned(out_buf, kGuard) + misalign * engine::dtype_size(ov.dtype);
      uint8_t* xin = aligned(in_buf, 0) + misalign * engine::dtype_size(xv.dtype);
      std::memcpy(xin, x_bytes.data(), x_bytes.size());
      std::memset(o - kGuard, 0xA5, ov.nbytes() + 2 * kGuard);
      std::vector<void*> ptrs = {o, xin};
      if (weight >= 0) ptrs.push_back(const_cast<uint8_t*>(g.value(weight).data.data()));
      long long n = ov.numel();
      std::vector<void*> args;
      for (void*& ptr : ptrs) args.push_back(&ptr);
      args.push_back(&n);
      launch(args.data(), blocks, block, high ? 1 : 0);
      for (size_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(o[i - kGuard], 0xA5) << "wrote before the output";
        ASSERT_EQ(o[ov.nbytes() + i], 0xA5) << "wrote past the output";
      }
      std::vector<uint8_t> got(o, o + ov.nbytes());
      size_t bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double y = read_elem(ov.dtype, got, i);
        const bool same = std::isinf(ref[i]) ? y == ref[i] : std::fabs(y - ref[i]) <= tol * (1.0 + std::fabs(ref[i]));
        if (!same && ++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << y << ", expected " << ref[i];
      }
      EXPECT_EQ(bad, 0u);
    };
    run(grid, false, 0, "the lowering's grid");
    run(grid + 2, true, 0, "extra blocks do nothing; the last warp first");
    if (vector > 1) run(grid, false, 1, "misaligned: the scalar path");
    dlclose(lib);
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(RowKernel, SoftmaxOverTheLastDim) {
  check(softmax_case("short_rows", {5, 7}, -1, false, DType::kFloat32));      // warp rows, ragged
  check(softmax_case("vector_rows", {6, 64}, -1, false, DType::kFloat32));    // 16-byte loads
  check(softmax_case("vit_rows", {2, 3, 197}, -1, false, DType::kFloat16));   // scalar loads
  check(softmax_case("half_vectors", {4, 256}, -1, true, DType::kFloat16));
  check(softmax_case("bf16_block_rows", {2, 1000}, -1, false, DType::kBFloat16));
  check(softmax_case("block_rows", {2, 4096}, -1, true, DType::kFloat32));
  check(softmax_case("streamed", {2, 50000}, -1, false, DType::kFloat32));
  EXPECT_FALSE(ops::softmax_launch(ops::SoftmaxPlan{}, 4).strided);
}

TEST_F(RowKernel, ThreadCountsAgree) {
  for (int64_t tpr : {32, 64, 256, 1024}) {
    Case c = softmax_case("tpr" + std::to_string(tpr), {3, 300}, -1, tpr == 64, DType::kFloat32);
    c.threads_per_row = tpr;
    check(c);
  }
  Case warp_stream = softmax_case("warp_streamed", {3, 1500}, -1, false, DType::kFloat16);
  warp_stream.threads_per_row = 32;
  check(warp_stream);
}

TEST_F(RowKernel, SoftmaxOverOtherDims) {
  check(softmax_case("dim1", {3, 37, 5, 6}, 1, false, DType::kFloat32));
  check(softmax_case("dim0_log", {40, 70}, 0, true, DType::kFloat32));
  check(softmax_case("dim_minus2_short", {2, 5, 6}, -2, false, DType::kFloat16));
  check(softmax_case("dim1_long", {2, 100, 33}, 1, true, DType::kBFloat16));
}

TEST_F(RowKernel, MaskedRows) {
  // Some -inf elements; and whole rows of -inf: NaN from softmax (as
  // PyTorch), 0 from the safe chain.
  Case partial = softmax_case("partly_masked", {6, 40}, -1, false, DType::kFloat32);
  partial.masked = 0.3;
  check(partial);
  Case safe = safe_case("safe", {2, 3, 40}, DType::kFloat32);
  safe.masked = 0.3;
  safe.masked_rows = {1, 4};
  check(safe);
  Case safe_half = safe_case("safe_half", {4, 197}, DType::kFloat16);
  safe_half.masked_rows = {0, 3};
  check(safe_half);
}

TEST_F(RowKernel, RmsNormIsOneKernel) {
  check(rms_case("llama_fp32", {2, 7, 64}, DType::kFloat32, false, false, true, rng_));
  check(rms_case("llama_half_casts", {3, 4096}, DType::kFloat16, true, false, true, rng_));
  check(rms_case("torch_rmsnorm", {5, 96}, DType::kFloat32, false, true, false, rng_));
  check(rms_case("bf16_odd", {3, 77}, DType::kBFloat16, true, true, false, rng_));
  Case stream = rms_case("rms_streamed", {2, 40000}, DType::kFloat32, false, true, true, rng_);
  check(stream);
}

// Qwen3's per-head q and k norms: rows of head_dim that are columns of the merged q|k|v
// projection are read in place (one kernel, no slice copy), in the vector and scalar forms.
TEST_F(RowKernel, PerHeadRmsNormReadsColumnsOfAWiderTensor) {
  // q: the first 4 heads of 128 of a [3, 256] projection; k: 2 heads from column 128.
  check(rms_case("q_heads_fp32", {3, 4, 32}, DType::kFloat32, false, true, true, rng_, {256, 0, 4}));
  check(rms_case("k_heads_bf16", {3, 2, 32}, DType::kBFloat16, true, false, true, rng_, {256, 128, 2}));
  // A start that is no multiple of the vector width: scalar loads.
  check(rms_case("odd_start_fp16", {2, 3, 16}, DType::kFloat16, true, true, false, rng_, {100, 3, 3}));
}

TEST(RowPlanning, RmsNormChainThatDoesNotMatchStaysUnfused) {
  std::mt19937 rng(1);
  Case c = rms_case("mean_used_twice", {2, 16}, DType::kFloat32, false, false, true, rng);
  ir::Graph& g = c.graph;
  // The mean is also a graph output: nothing may be absorbed.
  int mean = -1;
  for (const ir::Node& n : g.nodes())
    if (n.op == "aten.mean.dim") mean = n.outputs[0];
  g.set_outputs({g.outputs()[0], mean});
  passes::ExecPlan plan = passes::fuse(g);
  for (const auto& op : plan.ops) EXPECT_FALSE(op.is<ops::RmsNormPlan>()) << op.label;
  EXPECT_GE(plan.ops.size(), 3u);
}

TEST(RowPlanning, SafeChainWithAnotherReaderStaysUnfused) {
  Case c = safe_case("sm_read_twice", {2, 8}, DType::kFloat32);
  ir::Graph& g = c.graph;
  int sm = g.nodes()[0].outputs[0];
  g.set_outputs({g.outputs()[0], sm});
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_FALSE(plan.ops.empty());
  EXPECT_EQ(plan.ops[0].label, "softmax");
  bool any = false;
  for (const auto& op : plan.ops) any |= op.label == "any";
  EXPECT_TRUE(any) << "the chain compiles node by node";
}

}  // namespace
}  // namespace kiln
