// Normalizations (layer norm, group norm, batch norm on batch statistics,
// which instance norm becomes), no GPU needed: the generated kernel (the
// prelude the engine module starts with + the kernel, exactly as lowering
// makes them) is compiled as host C++ through cuda_block_shim.h, each block's
// threads run as cooperating fibers (shuffles, __syncthreads, shared memory),
// and the output is compared with the op's definition computed in double
// from the same inputs and parameters. Also: launch shapes, the NHWC forms
// the channels-last pass makes (no layout kernels around a ConvNeXt
// LayerNorm2d or a group norm between convolutions), the capability checks
// and the refusal of used statistics.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/layout_ops.h"
#include "ops/norm_kernel.h"
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

constexpr const char* kLayerNorm = "aten.native_layer_norm.default";
constexpr const char* kGroupNorm = "aten.native_group_norm.default";
constexpr const char* kBatchNormStats = "aten._native_batch_norm_legit.no_stats";

int64_t numel(const std::vector<int64_t>& s) { return ir::numel_of(s); }


std::vector<double> to_doubles(DType d, const std::vector<uint8_t>& bytes, int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) v[i] = read_elem(d, bytes, i);
  return v;
}

// ---- the ops' definitions, in double, NCHW (contiguous) ----------------------

// y[e] = (x[e] - mean) / sqrt(var + eps) * w[p(e)] + b[p(e)] over each set of
// element indices `rows[r]`, with parameter index p.
std::vector<double> normalize_sets(const std::vector<double>& x, const std::vector<std::vector<int64_t>>& sets,
                                   const std::function<int64_t(int64_t)>& param, const std::vector<double>* w,
                                   const std::vector<double>* b, double eps) {
  std::vector<double> y(x.size(), std::nan(""));
  for (const auto& set : sets) {
    double mean = 0, var = 0;
    for (int64_t e : set) mean += x[static_cast<size_t>(e)];
    mean /= static_cast<double>(set.size());
    for (int64_t e : set) var += (x[static_cast<size_t>(e)] - mean) * (x[static_cast<size_t>(e)] - mean);
    var /= static_cast<double>(set.size());
    for (int64_t e : set) {
      double v = (x[static_cast<size_t>(e)] - mean) / std::sqrt(var + eps);
      if (w) v *= (*w)[static_cast<size_t>(param(e))];
      if (b) v += (*b)[static_cast<size_t>(param(e))];
      y[static_cast<size_t>(e)] = v;
    }
  }
  return y;
}

std::vector<double> layer_norm_ref(const std::vector<double>& x, const std::vector<int64_t>& shape, size_t k,
                                   const std::vector<double>* w, const std::vector<double>* b, double eps) {
  const int64_t L = numel(std::vector<int64_t>(shape.end() - static_cast<std::ptrdiff_t>(k), shape.end()));
  std::vector<std::vector<int64_t>> sets(static_cast<size_t>(numel(shape) / L));
  for (int64_t e = 0; e < numel(shape); ++e) sets[static_cast<size_t>(e / L)].push_back(e);
  return normalize_sets(x, sets, [L](int64_t e) { return e % L; }, w, b, eps);
}

std::vector<double> group_norm_ref(const std::vector<double>& x, const std::vector<int64_t>& shape, int64_t groups,
                                   const std::vector<double>* w, const std::vector<double>* b, double eps) {
  const int64_t n = shape[0], c = shape[1], hw = numel(shape) / (n * c), cg = c / groups;
  std::vector<std::vector<int64_t>> sets(static_cast<size_t>(n * groups));
  for (int64_t e = 0; e < numel(shape); ++e) {
    const int64_t ch = (e / hw) % c, in = e / (hw * c);
    sets[static_cast<size_t>(in * groups + ch / cg)].push_back(e);
  }
  return normalize_sets(x, sets, [hw, c](int64_t e) { return (e / hw) % c; }, w, b, eps);
}

std::vector<double> batch_stats_ref(const std::vector<double>& x, const std::vector<int64_t>& shape,
                                    const std::vector<double>* w, const std::vector<double>* b, double eps) {
  const int64_t n = shape[0], c = shape[1], hw = numel(shape) / (n * c);
  std::vector<std::vector<int64_t>> sets(static_cast<size_t>(c));
  for (int64_t e = 0; e < numel(shape); ++e) sets[static_cast<size_t>((e / hw) % c)].push_back(e);
  return normalize_sets(x, sets, [hw, c](int64_t e) { return (e / hw) % c; }, w, b, eps);
}

// NHWC <-> NCHW of a [n, c, h, w] tensor's values.
std::vector<double> nhwc_to_nchw(const std::vector<double>& v, const std::vector<int64_t>& nchw) {
  const int64_t n = nchw[0], c = nchw[1], h = nchw[2], w = nchw[3];
  std::vector<double> out(v.size());
  for (int64_t a = 0; a < n; ++a)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j)
          out[static_cast<size_t>(((a * c + ch) * h + i) * w + j)] = v[static_cast<size_t>(((a * h + i) * w + j) * c + ch)];
  return out;
}
std::vector<double> nchw_to_nhwc(const std::vector<double>& v, const std::vector<int64_t>& nchw) {
  const int64_t n = nchw[0], c = nchw[1], h = nchw[2], w = nchw[3];
  std::vector<double> out(v.size());
  for (int64_t a = 0; a < n; ++a)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j)
          out[static_cast<size_t>(((a * h + i) * w + j) * c + ch)] = v[static_cast<size_t>(((a * c + ch) * h + i) * w + j)];
  return out;
}

// ---- graphs -----------------------------------------------------------------

// A norm node with 3 outputs (the op's, stats shaped as the schema's); returns
// the node index.
int add_norm(ir::Graph& g, const std::string& op, std::vector<int> inputs, Attrs attrs, DType dtype,
             const std::vector<int64_t>& shape, const std::vector<int64_t>& stats) {
  return g.add_node(op, "norm", std::move(inputs), std::move(attrs),
                    {{dtype, shape}, {DType::kFloat32, stats}, {DType::kFloat32, stats}});
}
std::vector<uint8_t> random_bytes(DType d, int64_t count, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  return testing::random_elems(d, count, rng, lo, hi);
}
using testing::out0;

struct Case {
  std::string name;
  ir::Graph graph;
  int x = -1;  // the graph input the kernel reads (directly or through a view)
  // Reference output (the bytes' layout of the norm's output) from the
  // input's values, with the parameters as the kernel reads them.
  std::function<std::vector<double>(const std::vector<double>& x, const ir::Graph& planned, const ops::NormPlan& p)>
      reference;
  float offset = 0.0f;  // added to every input value (a large mean tests stability)
  double tolerance = 0.0;  // 0: from the output dtype
  int64_t threads_per_row = 0;  // 0: the lowering's choice
  int64_t expect_vector = 0;    // the vector width the kernel must use (0: any)
};

std::vector<double> param_values(const ir::Graph& g, int v) {
  if (v < 0) return {};
  const ir::Value& val = g.value(v);
  return to_doubles(val.dtype, val.data, val.numel());
}

Case layer_norm_case(const std::string& name, std::vector<int64_t> shape, size_t k, bool weight, bool bias,
                     DType dtype, std::mt19937& rng, double eps = 1e-5) {
  Case c;
  c.name = name;
  ir::Graph& g = c.graph;
  c.x = g.add_input("x", dtype, shape);
  const std::vector<int64_t> normalized(shape.end() - static_cast<std::ptrdiff_t>(k), shape.end());
  std::vector<int> inputs = {c.x};
  Attrs attrs = {{"normalized_shape", normalized}, {"eps", eps}};
  if (weight) inputs.push_back(g.add_constant("w", dtype, normalized, random_bytes(dtype, numel(normalized), rng, 0.5f, 1.5f)));
  else attrs["weight_absent"] = true;
  if (bias) inputs.push_back(g.add_constant("b", dtype, normalized, random_bytes(dtype, numel(normalized), rng)));
  std::vector<int64_t> stats = shape;
  for (size_t i = 0; i < k; ++i) stats[stats.size() - 1 - i] = 1;
  int node = add_norm(g, kLayerNorm, inputs, attrs, dtype, shape, stats);
  g.set_outputs({out0(g, node)});
  c.reference = [shape, k, eps](const std::vector<double>& x, const ir::Graph& pg, const ops::NormPlan& p) {
    std::vector<double> w = param_values(pg, p.weight), b = param_values(pg, p.bias);
    return layer_norm_ref(x, shape, k, p.weight >= 0 ? &w : nullptr, p.bias >= 0 ? &b : nullptr, eps);
  };
  return c;
}

Case group_norm_case(const std::string& name, std::vector<int64_t> shape, int64_t groups, bool affine, DType dtype,
                     std::mt19937& rng) {
  Case c;
  c.name = name;
  ir::Graph& g = c.graph;
  c.x = g.add_input("x", dtype, shape);
  const int64_t ch = shape[1];
  std::vector<int> inputs = {c.x};
  if (affine) {
    inputs.push_back(g.add_constant("w", dtype, {ch}, random_bytes(dtype, ch, rng, 0.5f, 1.5f)));
    inputs.push_back(g.add_constant("b", dtype, {ch}, random_bytes(dtype, ch, rng)));
  }
  Attrs attrs = {{"N", shape[0]}, {"C", ch}, {"HxW", numel(shape) / (shape[0] * ch)}, {"group", groups}, {"eps", 1e-5}};
  int node = add_norm(g, kGroupNorm, inputs, attrs, dtype, shape, {shape[0], groups});
  g.set_outputs({out0(g, node)});
  c.reference = [shape, groups](const std::vector<double>& x, const ir::Graph& pg, const ops::NormPlan& p) {
    std::vector<double> w = param_values(pg, p.weight), b = param_values(pg, p.bias);
    return group_norm_ref(x, shape, groups, p.weight >= 0 ? &w : nullptr, p.bias >= 0 ? &b : nullptr, 1e-5);
  };
  return c;
}

// nn.InstanceNorm2d as torch.export + to_edge give it: the input viewed as
// [1, n*c, h, w], the affine parameters repeated n times, batch norm on
// batch statistics, the result viewed back.
Case instance_norm_case(const std::string& name, std::vector<int64_t> shape, bool affine, DType dtype,
                        std::mt19937& rng) {
  Case c;
  c.name = name;
  ir::Graph& g = c.graph;
  const int64_t n = shape[0], ch = shape[1];
  c.x = g.add_input("x", dtype, shape);
  std::vector<int64_t> merged = shape;
  merged[0] = 1;
  merged[1] = n * ch;
  int view = out0(g, g.add_node("aten.view_copy.default", "view", {c.x}, {{"size", merged}}, {{dtype, merged}}));
  std::vector<int> inputs = {view};
  if (affine) {
    for (const char* p : {"w", "b"}) {
      int param = g.add_constant(p, dtype, {ch}, random_bytes(dtype, ch, rng, 0.5f, 1.5f));
      inputs.push_back(out0(g, g.add_node("aten.repeat.default", std::string(p) + "_rep", {param},
                                          {{"repeats", std::vector<int64_t>{n}}}, {{dtype, {n * ch}}})));
    }
  }
  int node = add_norm(g, kBatchNormStats, inputs, {{"training", true}, {"momentum", 0.1}, {"eps", 1e-5}}, dtype,
                      merged, {n * ch});
  int back = out0(g, g.add_node("aten.view_copy.default", "view_back", {out0(g, node)}, {{"size", shape}},
                                {{dtype, shape}}));
  g.set_outputs({back});
  c.reference = [shape, affine](const std::vector<double>& x, const ir::Graph& pg, const ops::NormPlan& p) {
    // Instance norm = group norm with a group per channel; the kernel's
    // parameters are the repeated ones, so take the first n*c/n... of each.
    std::vector<double> w = param_values(pg, p.weight), b = param_values(pg, p.bias);
    w.resize(affine ? static_cast<size_t>(shape[1]) : 0);
    b.resize(affine ? static_cast<size_t>(shape[1]) : 0);
    return group_norm_ref(x, shape, shape[1], affine ? &w : nullptr, affine ? &b : nullptr, 1e-5);
  };
  return c;
}

// The kiln.*_nhwc form of a norm, as the channels-last pass makes it: input
// and output NHWC [n, h, w, c], attributes of the NCHW op.
Case nhwc_case(const std::string& name, const std::string& kind, std::vector<int64_t> nchw, int64_t groups,
               DType dtype, std::mt19937& rng) {
  Case c;
  c.name = name;
  ir::Graph& g = c.graph;
  const std::vector<int64_t> nhwc = {nchw[0], nchw[2], nchw[3], nchw[1]};
  const int64_t ch = nchw[1];
  c.x = g.add_input("x", dtype, nhwc);
  std::vector<int64_t> pshape = kind == "layer" ? std::vector<int64_t>{nchw[1], nchw[2], nchw[3]} : std::vector<int64_t>{ch};
  int w = g.add_constant("w", dtype, pshape, random_bytes(dtype, numel(pshape), rng, 0.5f, 1.5f));
  int b = g.add_constant("b", dtype, pshape, random_bytes(dtype, numel(pshape), rng));
  Attrs attrs = {{"eps", 1e-5}};
  std::string op;
  if (kind == "layer") {
    op = "kiln.layer_norm_nhwc";
    attrs["normalized_shape"] = pshape;
  } else if (kind == "group") {
    op = "kiln.group_norm_nhwc";
    attrs.insert({{"N", nchw[0]}, {"C", ch}, {"HxW", nchw[2] * nchw[3]}, {"group", groups}});
  } else {
    op = "kiln.batch_norm_stats_nhwc";
    attrs.insert({{"training", true}, {"momentum", 0.1}});
  }
  int node = g.add_node(op, "norm", {c.x, w, b}, attrs, {{dtype, nhwc}});
  g.set_outputs({out0(g, node)});
  c.reference = [kind, nchw, groups](const std::vector<double>& x, const ir::Graph& pg, const ops::NormPlan& p) {
    std::vector<double> w = param_values(pg, p.weight), b = param_values(pg, p.bias);
    std::vector<double> xs = nhwc_to_nchw(x, nchw), y;
    if (kind == "layer") y = layer_norm_ref(xs, nchw, 3, &w, &b, 1e-5);
    else if (kind == "group") y = group_norm_ref(xs, nchw, groups, &w, &b, 1e-5);
    else y = batch_stats_ref(xs, nchw, &w, &b, 1e-5);
    return nchw_to_nhwc(y, nchw);
  };
  return c;
}

// ---- the harness --------------------------------------------------------------

class NormKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }

  // The compiler's passes up to fusion; the one NormPlan they make.
  static const ops::NormPlan* plan_of(ir::Graph& g, passes::ExecPlan& plan, std::string* label) {
    g.verify();
    passes::fold_constants(g);
    g = passes::fold_batch_norm(g);
    g = passes::to_channels_last(g);
    passes::fold_constants(g);
    plan = passes::fuse(g);
    const ops::NormPlan* found = nullptr;
    for (const auto& op : plan.ops) {
      EXPECT_TRUE(op.is<ops::NormPlan>()) << "unexpected step " << op.label;
      if (op.is<ops::NormPlan>()) {
        EXPECT_EQ(found, nullptr) << "one norm step";
        found = op.as<ops::NormPlan>();
        *label = op.label;
      }
    }
    return found;
  }

  void check(Case c, const std::string& expect_label) {
    SCOPED_TRACE(c.name + ", seed " + std::to_string(seed_));
    ir::Graph g = c.graph;
    passes::ExecPlan plan;
    std::string label;
    const ops::NormPlan* p = plan_of(g, plan, &label);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(label, expect_label);
    ops::NormKernel gen = ops::generate_norm_kernel(g, *p, "kiln_norm_test", c.threads_per_row);
    std::string src = testing::host_prelude() + gen.source +
                      "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block, int high_first) {\n"
                      "  kiln_shim_launch_blocks(&kiln_norm_test, args, grid, block,\n"
                      "      high_first ? kiln_shim::Order::kHighWarpFirst : kiln_shim::Order::kLowWarpFirst);\n}\n";
    void* lib = testing::build_host_module(src, "norm_" + c.name, KILN_BLOCK_SHIM_HEADER);
    ASSERT_NE(lib, nullptr);
    using Launch = void (*)(void**, unsigned, unsigned, int);
    auto launch = reinterpret_cast<Launch>(dlsym(lib, "kiln_test_launch"));
    ASSERT_NE(launch, nullptr);

    const ir::Value& xv = g.value(c.x);
    const ir::Value& in = g.value(p->input);
    const ir::Value& ov = g.value(p->out);
    ASSERT_EQ(in.nbytes(), xv.nbytes());
    std::vector<uint8_t> x_bytes = random_bytes(xv.dtype, xv.numel(), rng_, -2.0f, 2.0f);
    if (c.offset != 0.0f)
      for (size_t i = 0; i < static_cast<size_t>(xv.numel()); ++i)
        write_elem(xv.dtype, x_bytes, i, static_cast<float>(read_elem(xv.dtype, x_bytes, i)) + c.offset);
    const std::vector<double> x = to_doubles(xv.dtype, x_bytes, xv.numel());
    std::vector<double> ref = c.reference(x, g, *p);
    ASSERT_EQ(ref.size(), static_cast<size_t>(ov.numel()));
    for (double& r : ref) r = round_to(ov.dtype, r);
    const double tol = c.tolerance > 0 ? c.tolerance
                       : ov.dtype == DType::kFloat32 ? 2e-5
                       : ov.dtype == DType::kFloat16 ? 1.0 / 1024
                                                      : 1.0 / 128;

    // Buffers 64-byte aligned, x and out then moved by `misalign` elements
    // (a vector kernel's scalar path); guard bytes around the output.
    auto run = [&](unsigned grid, bool high_first, size_t misalign, const std::string& what) {
      SCOPED_TRACE(what);
      constexpr size_t kGuard = 64;
      const size_t out_shift = misalign * engine::dtype_size(ov.dtype);
      const size_t in_shift = misalign * engine::dtype_size(xv.dtype);
      std::vector<uint8_t> out_buf(ov.nbytes() + 2 * kGuard + 128, 0xA5), in_buf(x_bytes.size() + 128);
      auto aligned = [](std::vector<uint8_t>& b, size_t at) {
        return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(b.data()) + at + 63) / 64 * 64);
      };
      uint8_t* out = aligned(out_buf, kGuard) + out_shift;
      uint8_t* xin = aligned(in_buf, 0) + in_shift;
      std::memcpy(xin, x_bytes.data(), x_bytes.size());
      std::memset(out - kGuard, 0xA5, ov.nbytes() + 2 * kGuard);
      std::vector<void*> ptrs = {out, xin};
      for (int v : {p->weight, p->bias})
        if (v >= 0) {
          ASSERT_TRUE(g.value(v).is_constant) << g.value(v).name;
          ptrs.push_back(const_cast<uint8_t*>(g.value(v).data.data()));
        }
      long long n = ov.numel();
      std::vector<void*> args;
      for (void*& ptr : ptrs) args.push_back(&ptr);
      args.push_back(&n);
      launch(args.data(), grid, gen.launch.block, high_first ? 1 : 0);
      for (size_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(out[i - kGuard], 0xA5) << "wrote before the output";
        ASSERT_EQ(out[ov.nbytes() + i], 0xA5) << "wrote past the output";
      }
      std::vector<uint8_t> got(out, out + ov.nbytes());
      size_t bad = 0;
      for (size_t o = 0; o < ref.size(); ++o) {
        const double y = read_elem(ov.dtype, got, o);
        if (!(std::fabs(y - ref[o]) <= tol * (1.0 + std::fabs(ref[o]))) && ++bad <= 5)
          ADD_FAILURE() << "element " << o << ": got " << y << ", expected " << ref[o];
      }
      EXPECT_EQ(bad, 0u);
    };
    run(gen.launch.grid, false, 0, "the lowering's grid");
    run(gen.launch.grid + 2, true, 0, "extra blocks past the last row do nothing; the last warp first");
    if (gen.launch.vector > 1) run(gen.launch.grid, false, 1, "x and out misaligned: the scalar path");
    if (c.expect_vector) EXPECT_EQ(gen.launch.vector, c.expect_vector);
    dlclose(lib);
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(NormKernel, LayerNormMatchesDefinition) {
  // warp rows (4 a block), block rows (128 threads), two trailing dims (a
  // ragged last pass), no affine, bias only, a 1024-thread row.
  check(layer_norm_case("ln_c96", {3, 5, 96}, 1, true, true, DType::kFloat32, rng_), "layer_norm");
  Case plain = layer_norm_case("ln_768_plain", {2, 3, 768}, 1, false, false, DType::kFloat32, rng_);
  plain.expect_vector = 4;
  check(plain, "layer_norm");
  check(layer_norm_case("ln_two_dims", {2, 5, 40}, 2, true, true, DType::kFloat32, rng_), "layer_norm");
  Case odd = layer_norm_case("ln_odd", {3, 77}, 1, true, true, DType::kFloat32, rng_);
  odd.expect_vector = 1;
  check(odd, "layer_norm");
  check(layer_norm_case("ln_bias_only", {4, 72}, 1, false, true, DType::kFloat32, rng_, 1e-3), "layer_norm");
  check(layer_norm_case("ln_weight_only", {3, 1000}, 1, true, false, DType::kFloat32, rng_), "layer_norm");
  check(layer_norm_case("ln_wide", {2, 9000}, 1, true, true, DType::kFloat32, rng_), "layer_norm");
}

TEST_F(NormKernel, LongRowsStreamWithWelford) {
  Case c = layer_norm_case("ln_stream", {2, 40000}, 1, true, true, DType::kFloat32, rng_);
  EXPECT_FALSE(ops::norm_launch(2, 40000, 0, 4).cached);
  check(c, "layer_norm");
  // A mean far from zero: a one-pass sum of squares in float would lose the
  // variance; Welford (streaming) and the two-pass form (cached) keep it.
  Case shifted = layer_norm_case("ln_stream_shifted", {2, 40000}, 1, false, false, DType::kFloat32, rng_);
  shifted.offset = 1000.0f;
  shifted.tolerance = 2e-3;
  check(shifted, "layer_norm");
  Case cached = layer_norm_case("ln_cached_shifted", {4, 768}, 1, false, false, DType::kFloat32, rng_);
  cached.offset = 1000.0f;
  cached.tolerance = 2e-3;
  check(cached, "layer_norm");
}

TEST_F(NormKernel, WarpBlockAndStreamingFormsAgree) {
  // One row shape through every form: a warp a row (values in registers or,
  // past 32 a thread, streamed), and blocks of 64..1024 threads a row.
  for (int64_t tpr : {32, 64, 256, 1024}) {
    Case c = layer_norm_case("ln_tpr" + std::to_string(tpr), {3, 7, 150}, 1, true, true, DType::kFloat32, rng_);
    c.threads_per_row = tpr;
    check(c, "layer_norm");
  }
  Case stream = layer_norm_case("ln_warp_stream", {5, 1500}, 1, true, true, DType::kFloat32, rng_);
  stream.threads_per_row = 32;
  EXPECT_FALSE(ops::norm_launch(5, 1500, 32).cached);
  check(stream, "layer_norm");
  Case group = group_norm_case("gn_tpr64", {2, 16, 9, 9}, 4, true, DType::kFloat16, rng_);
  group.threads_per_row = 64;
  check(group, "group_norm");
}

TEST_F(NormKernel, GroupNormMatchesDefinition) {
  check(group_norm_case("gn_4_groups", {2, 16, 12, 12}, 4, true, DType::kFloat32, rng_), "group_norm");
  check(group_norm_case("gn_plain", {3, 6, 5, 7}, 3, false, DType::kFloat32, rng_), "group_norm");
  check(group_norm_case("gn_3d", {2, 8, 50}, 2, true, DType::kFloat32, rng_), "group_norm");
  // 32 groups of 2 channels over 40x40 maps (a 1024-thread block a row), and
  // 4 groups of 16 channels over 48x48 (streaming).
  check(group_norm_case("gn_32_groups", {1, 64, 40, 40}, 32, true, DType::kFloat32, rng_), "group_norm");
  check(group_norm_case("gn_stream", {1, 64, 48, 48}, 4, true, DType::kFloat32, rng_), "group_norm");
}

TEST_F(NormKernel, InstanceNormMatchesDefinition) {
  check(instance_norm_case("in_affine", {2, 8, 10, 10}, true, DType::kFloat32, rng_), "batch_norm_stats");
  check(instance_norm_case("in_plain", {3, 4, 7, 9}, false, DType::kFloat32, rng_), "batch_norm_stats");
}

TEST_F(NormKernel, ChannelsLastFormsMatchDefinition) {
  check(nhwc_case("nhwc_group", "group", {2, 16, 6, 5}, 4, DType::kFloat32, rng_), "group_norm");
  check(nhwc_case("nhwc_layer_chw", "layer", {2, 12, 4, 5}, 0, DType::kFloat32, rng_), "layer_norm");
  check(nhwc_case("nhwc_batch_stats", "batch", {3, 8, 5, 4}, 0, DType::kFloat32, rng_), "batch_norm_stats");
}

TEST_F(NormKernel, HalfAndBFloat16MatchDefinition) {
  Case f16 = layer_norm_case("ln_f16", {4, 768}, 1, true, true, DType::kFloat16, rng_);
  f16.expect_vector = 8;
  check(f16, "layer_norm");
  check(layer_norm_case("ln_bf16", {5, 96}, 1, true, true, DType::kBFloat16, rng_), "layer_norm");
  check(group_norm_case("gn_f16", {2, 16, 12, 12}, 4, true, DType::kFloat16, rng_), "group_norm");
  check(instance_norm_case("in_bf16", {2, 8, 10, 10}, true, DType::kBFloat16, rng_), "batch_norm_stats");
  check(nhwc_case("nhwc_group_f16", "group", {1, 32, 8, 8}, 8, DType::kFloat16, rng_), "group_norm");
}

// ---- launch shapes and planning ------------------------------------------------

TEST(NormLaunch, ShapesForTransformerRowsAndGroupNormMaps) {
  // [b, seq, 768] float32 layer norm: one 128-thread block a row, two
  // 4-float vectors a thread in registers.
  ops::NormLaunch ln = ops::norm_launch(8 * 197, 768, 0, 4);
  EXPECT_EQ(ln.threads_per_row, 128);
  EXPECT_EQ(ln.rows_per_block, 1);
  EXPECT_TRUE(ln.cached);
  EXPECT_EQ(ln.vector, 4);
  EXPECT_EQ(ln.per_thread, 8);
  EXPECT_EQ(ln.grid, 8u * 197u);
  EXPECT_EQ(ln.block, 128u);
  // ConvNeXt's 96 channels: a warp a row, 4 rows a block.
  ops::NormLaunch cnx = ops::norm_launch(56 * 56, 96, 0, 4);
  EXPECT_EQ(cnx.threads_per_row, 32);
  EXPECT_EQ(cnx.rows_per_block, 4);
  EXPECT_EQ(cnx.grid, 56u * 56u / 4u);
  EXPECT_EQ(cnx.block, 128u);
  // [1, 32 groups] over 56x56 maps: one 1024-thread block a group, in
  // registers up to 8 channels a group (25088 elements), streaming for 16.
  ops::NormLaunch gn2 = ops::norm_launch(32, 2 * 56 * 56, 0, 4);
  EXPECT_EQ(gn2.block, 1024u);
  EXPECT_EQ(gn2.grid, 32u);
  EXPECT_TRUE(gn2.cached);
  ops::NormLaunch gn8 = ops::norm_launch(32, 8 * 56 * 56, 0, 4);
  EXPECT_EQ(gn8.block, 1024u);
  EXPECT_TRUE(gn8.cached);
  ops::NormLaunch gn16 = ops::norm_launch(32, 16 * 56 * 56, 0, 4);
  EXPECT_EQ(gn16.block, 1024u);
  EXPECT_FALSE(gn16.cached);
  EXPECT_EQ(gn16.vector, 1);
  // No vector when the row does not divide into them.
  EXPECT_EQ(ops::norm_launch(4, 30, 0, 4).vector, 1);
}

// x -> conv -> (to NHWC, layer norm over c, to NCHW) -> conv, ConvNeXt's
// LayerNorm2d between convolutions: the permutes cancel against the
// channels-last layout, the layer norm runs on the conv's NHWC output, and
// the only layout kernels are the engine's edges.
ir::Graph convnext_like(std::mt19937& rng, bool group_norm) {
  ir::Graph g;
  const int64_t n = 2, c = 32, h = 6, w = 6;
  int x = g.add_input("x", DType::kFloat32, {n, 3, h, w});
  auto conv = [&](int in, int64_t cin, int64_t cout, const std::string& name) {
    int wt = g.add_constant(name + "_w", DType::kFloat32, {cout, cin, 3, 3},
                            testing::random_float_bytes(static_cast<size_t>(cout * cin * 9), rng));
    Attrs a = {{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}},
               {"dilation", std::vector<int64_t>{1, 1}}, {"transposed", false},
               {"output_padding", std::vector<int64_t>{0, 0}}, {"groups", int64_t{1}}};
    return out0(g, g.add_node("aten.convolution.default", name, {in, wt}, a, {{DType::kFloat32, {n, cout, h, w}}}));
  };
  int y = conv(x, 3, c, "conv1");
  int wv = g.add_constant("ln_w", DType::kFloat32, {c}, testing::random_float_bytes(static_cast<size_t>(c), rng));
  int bv = g.add_constant("ln_b", DType::kFloat32, {c}, testing::random_float_bytes(static_cast<size_t>(c), rng));
  if (group_norm) {
    y = out0(g, add_norm(g, kGroupNorm, {y, wv, bv},
                         {{"N", n}, {"C", c}, {"HxW", h * w}, {"group", int64_t{8}}, {"eps", 1e-5}}, DType::kFloat32,
                         {n, c, h, w}, {n, 8}));
  } else {
    int p = out0(g, g.add_node("aten.permute_copy.default", "to_nhwc", {y}, {{"dims", std::vector<int64_t>{0, 2, 3, 1}}},
                               {{DType::kFloat32, {n, h, w, c}}}));
    int ln = out0(g, add_norm(g, kLayerNorm, {p, wv, bv}, {{"normalized_shape", std::vector<int64_t>{c}}, {"eps", 1e-6}},
                              DType::kFloat32, {n, h, w, c}, {n, h, w, 1}));
    y = out0(g, g.add_node("aten.permute_copy.default", "to_nchw", {ln}, {{"dims", std::vector<int64_t>{0, 3, 1, 2}}},
                           {{DType::kFloat32, {n, c, h, w}}}));
  }
  y = conv(y, c, 8, "conv2");
  g.set_outputs({y});
  return g;
}

size_t count_prefix(const engine::EngineDesc& d, const std::string& prefix) {
  size_t k = 0;
  for (const auto& s : d.steps) k += s.label.rfind(prefix, 0) == 0;
  return k;
}

TEST(NormPlanning, ConvNextLayerNorm2dNeedsNoLayoutKernels) {
  std::mt19937 rng(1);
  engine::EngineDesc d = compiler::compile_to_desc(convnext_like(rng, false), {});
  std::vector<std::string> labels;
  for (const auto& s : d.steps) labels.push_back(s.label);
  EXPECT_EQ(count_prefix(d, "layer_norm"), 1u);
  EXPECT_EQ(count_prefix(d, "permute"), 2u) << "only the engine's input and output change layout";
  EXPECT_EQ(labels.front(), "permute_copy");
  EXPECT_EQ(labels.back(), "permute_copy");
  ASSERT_EQ(d.modules.size(), 1u);  // NVRTC compiled the module
}

TEST(NormPlanning, GroupNormBetweenConvsRunsChannelsLast) {
  std::mt19937 rng(2);
  ir::Graph g = convnext_like(rng, true);
  g.verify();
  passes::fold_constants(g);
  g = passes::fold_batch_norm(g);
  g = passes::to_channels_last(g);
  size_t nhwc = 0;
  for (const auto& node : g.nodes()) nhwc += node.op == "kiln.group_norm_nhwc";
  EXPECT_EQ(nhwc, 1u);
  engine::EngineDesc d = compiler::compile_to_desc(convnext_like(rng, true), {});
  EXPECT_EQ(count_prefix(d, "group_norm"), 1u);
  EXPECT_EQ(count_prefix(d, "permute"), 2u);
}

TEST(NormPlanning, UsedStatisticsAreRefused) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {4, 16});
  int node = add_norm(g, kLayerNorm, {x}, {{"normalized_shape", std::vector<int64_t>{16}}, {"eps", 1e-5}},
                      DType::kFloat32, {4, 16}, {4, 1});
  g.set_outputs({out0(g, node), g.nodes()[static_cast<size_t>(node)].outputs[1]});
  try {
    compiler::compile_to_desc(g, {});
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("saved mean/rstd are used"), std::string::npos) << e.what();
  }
  auto first = compiler::first_output_only_ops();
  for (const char* op : {kLayerNorm, kGroupNorm, kBatchNormStats}) EXPECT_EQ(first.count(op), 1u) << op;
}

TEST(NormPlanning, CapabilityCheckRefusesWhatItCannotLower) {
  auto ask = [](const std::string& op, std::vector<std::vector<int64_t>> inputs, Attrs attrs) {
    ops::OpQuery q;
    q.op = op;
    for (auto& s : inputs) q.inputs.push_back({DType::kFloat32, s, false});
    q.attrs = std::move(attrs);
    q.outputs = {{DType::kFloat32, q.inputs[0].shape, false}, {DType::kFloat32, {1}, false},
                 {DType::kFloat32, {1}, false}};
    return compiler::check_support(q);
  };
  EXPECT_FALSE(ask(kLayerNorm, {{2, 8}, {8}, {8}}, {{"normalized_shape", std::vector<int64_t>{8}}, {"eps", 1e-5}}));
  EXPECT_FALSE(ask(kLayerNorm, {{2, 8}, {8}}, {{"normalized_shape", std::vector<int64_t>{8}}, {"weight_absent", true}}));
  auto why = ask(kLayerNorm, {{2, 8}}, {{"normalized_shape", std::vector<int64_t>{4}}});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("trailing dims"), std::string::npos) << *why;
  why = ask(kLayerNorm, {{2, 8}, {4}}, {{"normalized_shape", std::vector<int64_t>{8}}});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("weight"), std::string::npos) << *why;
  Attrs gn = {{"N", int64_t{2}}, {"C", int64_t{6}}, {"HxW", int64_t{9}}, {"group", int64_t{4}}, {"eps", 1e-5}};
  why = ask(kGroupNorm, {{2, 6, 3, 3}}, gn);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("groups"), std::string::npos) << *why;
  gn["group"] = int64_t{3};
  EXPECT_FALSE(ask(kGroupNorm, {{2, 6, 3, 3}, {6}, {6}}, gn));
  why = ask(kGroupNorm, {{2, 6, 3, 3}, {3}, {6}}, gn);
  ASSERT_TRUE(why);
  why = ask(kBatchNormStats, {{1, 6, 3, 3}}, {{"training", false}, {"eps", 1e-5}});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("training"), std::string::npos) << *why;
  EXPECT_FALSE(ask(kBatchNormStats, {{1, 6, 3, 3}, {6}, {6}}, {{"training", true}, {"eps", 1e-5}}));
}

// Instance norm's repeated parameters are folded at export; an as_strided
// that keeps the element order (ConvNeXt's classifier head) is a view.
TEST(NormPlanning, RepeatOfConstantsFoldsAndOrderKeepingAsStridedIsAView) {
  ir::Graph g;
  std::vector<uint8_t> w(3 * 4);
  for (int i = 0; i < 3; ++i) write_elem(DType::kFloat32, w, static_cast<size_t>(i), static_cast<float>(i + 1));
  int c = g.add_constant("c", DType::kFloat32, {3}, w);
  int rep = out0(g, g.add_node("aten.repeat.default", "rep", {c}, {{"repeats", std::vector<int64_t>{2, 2}}},
                               {{DType::kFloat32, {2, 6}}}));
  int x = g.add_input("x", DType::kFloat32, {2, 6});
  int sum = out0(g, g.add_node("aten.add.Tensor", "add", {x, rep}, {}, {{DType::kFloat32, {2, 6}}}));
  int s = out0(g, g.add_node("aten.as_strided_copy.default", "strided", {sum},
                             {{"size", std::vector<int64_t>{1, 12, 1}}, {"stride", std::vector<int64_t>{12, 1, 12}}},
                             {{DType::kFloat32, {1, 12, 1}}}));
  int y = out0(g, g.add_node("aten.relu.default", "relu", {s}, {}, {{DType::kFloat32, {1, 12, 1}}}));
  g.set_outputs({y});
  passes::fold_constants(g);
  ASSERT_TRUE(g.value(rep).is_constant);
  const double expect[] = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3};
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(read_elem(DType::kFloat32, g.value(rep).data, i), expect[i]) << i;
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 2u) << "add and relu, no as_strided kernel";
  for (const auto& op : plan.ops) EXPECT_EQ(op.label.find("as_strided"), std::string::npos) << op.label;
  EXPECT_EQ(plan.storage_of(s), plan.storage_of(sum));
}

}  // namespace
}  // namespace kiln
