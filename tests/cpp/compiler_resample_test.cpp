// Resample and pad kernels (upsample nearest/bilinear, constant /
// reflection / replication pads), no GPU needed: the generated CUDA source
// (the engine module's prelude + the kernel, exactly as lowering makes them)
// is compiled as host C++ through cuda_host_shim.h, run on the CPU thread by
// thread, and compared with
//   * index tables PyTorch 2.14 (CPU) produced for tricky scales (golden), and
//   * a reference written here from ATen's formulas (UpSample.h,
//     ReflectionPad.cpp, ReplicationPadding.cpp) in double, on fresh random
//     inputs, in float32 (1e-5) and float16/bfloat16 (their rounding).
// Also: the capability check's refusals and the compiled step (one kernel,
// NVRTC compiles it).
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
#include "ops/elementwise_kernel.h"
#include "ops/resample_kernel.h"
#include "ops/resample_ops.h"
#include "passes/dtype_convert.h"
#include "passes/passes.h"

#ifndef KILN_SHIM_HEADER
#error "KILN_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;

using testing::host_prelude;
using testing::read_elem;
using testing::round_to;
using testing::write_elem;

void* build_host_module(const std::string& source, const std::string& tag) {
  return testing::build_host_module(source, "resample_" + tag, KILN_SHIM_HEADER);
}

// One op on a graph input: the node's op name, attributes and output shape.
struct Case {
  std::string op;
  std::map<std::string, ir::Attr> attrs;
  std::vector<int64_t> in, out;
  std::string what;
};

std::string describe(const Case& c) { return c.what + " " + ir::shape_to_string(c.in) + " -> " + ir::shape_to_string(c.out); }

// A graph of dtype `dtype`: compute dtype float16 on a float16 graph loads
// and stores float16; on a float32 graph it loads float32 (the graph input).
ir::Graph make_graph(const Case& c, DType dtype) {
  ir::Graph g;
  int x = g.add_input("x", dtype, c.in);
  int n = g.add_node(c.op, "op", {x}, c.attrs, {{dtype, c.out}});
  g.set_outputs({g.nodes()[static_cast<size_t>(n)].outputs[0]});
  return g;
}

// The compiled plan of `c` (passes as compile_to_desc runs them up to fusion).
ops::ResamplePlan plan_of(const Case& c, DType compute, ir::Graph& g, DType graph_dtype = DType::kFloat32) {
  g = make_graph(c, graph_dtype);
  g.verify();
  passes::fold_constants(g);
  g = passes::to_channels_last(g);
  g = passes::apply_precision(g, compute);
  passes::ExecPlan plan = passes::fuse(g);
  const ops::ResamplePlan* found = nullptr;
  for (const auto& op : plan.ops)
    if (op.is<ops::ResamplePlan>()) found = op.as<ops::ResamplePlan>();
  if (found == nullptr) throw std::runtime_error("no resample step planned");
  return *found;
}

// `plan`'s kernel compiled for the CPU; run() launches it over `x`
// (row-major input values, exact in the plan input's dtype).
class HostKernel {
 public:
  HostKernel(const ir::Graph& g, const ops::ResamplePlan& plan, const std::string& tag) : g_(g), plan_(plan) {
    const std::string src = host_prelude() + ops::generate_resample_kernel(g, plan, "kiln_rs_test") +
                            "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block) {\n"
                            "  kiln_shim_launch(&kiln_rs_test, args, grid, block);\n}\n";
    lib_ = build_host_module(src, tag);
    if (lib_ != nullptr) launch_ = reinterpret_cast<Launch>(dlsym(lib_, "kiln_test_launch"));
  }
  ~HostKernel() {
    if (lib_ != nullptr) dlclose(lib_);
  }
  bool ok() const { return launch_ != nullptr; }

  // With the lowering's grid, or one block (the grid-stride loop).
  std::vector<double> run(const std::vector<float>& x, bool one_block = false) const {
    const ir::Value& iv = g_.value(plan_.input);
    const ir::Value& ov = g_.value(plan_.out);
    std::vector<uint8_t> in_bytes(iv.nbytes()), out_bytes(ov.nbytes(), 0xff);
    for (size_t i = 0; i < x.size(); ++i) write_elem(iv.dtype, in_bytes, i, x[i]);
    void* out_ptr = out_bytes.data();
    void* in_ptr = in_bytes.data();
    long long n = ov.numel();
    void* args[] = {&out_ptr, &in_ptr, &n};
    launch_(args, one_block ? 1u : ops::resample_grid(n), ops::kResampleBlock);
    std::vector<double> y(static_cast<size_t>(n));
    for (size_t i = 0; i < y.size(); ++i) y[i] = read_elem(ov.dtype, out_bytes, i);
    return y;
  }

 private:
  using Launch = void (*)(void**, unsigned, unsigned);
  const ir::Graph& g_;
  ops::ResamplePlan plan_;
  void* lib_ = nullptr;
  Launch launch_ = nullptr;
};

// ---- The reference, from ATen's formulas ----------------------------------

// compute_scales_value<float> / area_pixel_compute_scale<float>
float scale_value(double scale, int64_t in, int64_t out) {
  return scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
}

// upsample_nearest2d (CPU): nearest_idx
int64_t nearest_src(int64_t dst, int64_t in, int64_t out, double scale) {
  if (out == in) return dst;
  if (out == 2 * in) return dst >> 1;
  const float s = scale_value(scale, in, out);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(dst) * s)), in - 1);
}

// upsample_bilinear2d (CPU): compute_source_index_and_lambda
struct Taps {
  int64_t i0, i1;
  double l0, l1;
};
Taps linear_src(int64_t dst, int64_t in, int64_t out, bool align, double scale) {
  if (out == in) return {dst, dst, 1.0, 0.0};
  const float ratio =
      align ? (out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f) : scale_value(scale, in, out);
  float real = align ? ratio * static_cast<float>(dst) : ratio * (static_cast<float>(dst) + 0.5f) - 0.5f;
  if (!align && real < 0) real = 0;
  const int64_t i0 = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
  const float l1 = std::min(std::max(real - static_cast<float>(i0), 0.0f), 1.0f);
  return {i0, i0 + (i0 < in - 1 ? 1 : 0), 1.0f - l1, l1};
}

struct Interp {
  bool bilinear = false, align = false;
  double scale_h = 0, scale_w = 0;  // <= 0: none given
};

// y and, per element, the sum of the magnitudes it was made of (tolerance).
void reference_interp(const Case& c, const Interp& m, const std::vector<double>& x, std::vector<double>& y,
                      std::vector<double>& mag) {
  const int64_t NC = c.in[0] * c.in[1], H = c.in[2], W = c.in[3], P = c.out[2], Q = c.out[3];
  y.assign(static_cast<size_t>(NC * P * Q), 0.0);
  mag = y;
  for (int64_t b = 0; b < NC; ++b)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        const double* src = &x[static_cast<size_t>(b * H * W)];
        const size_t o = static_cast<size_t>((b * P + p) * Q + q);
        if (!m.bilinear) {
          y[o] = src[nearest_src(p, H, P, m.scale_h) * W + nearest_src(q, W, Q, m.scale_w)];
          mag[o] = std::fabs(y[o]);
          continue;
        }
        Taps th = linear_src(p, H, P, m.align, m.scale_h), tw = linear_src(q, W, Q, m.align, m.scale_w);
        auto row = [&](int64_t h) { return tw.l0 * src[h * W + tw.i0] + tw.l1 * src[h * W + tw.i1]; };
        auto row_mag = [&](int64_t h) { return std::fabs(src[h * W + tw.i0]) + std::fabs(src[h * W + tw.i1]); };
        y[o] = th.l0 * row(th.i0) + th.l1 * row(th.i1);
        mag[o] = row_mag(th.i0) + row_mag(th.i1);
      }
}

enum class PadMode { kConstant, kReflect, kReplicate };

// pads: PyTorch's order (last dim first, before/after pairs).
void reference_pad(const Case& c, PadMode mode, const std::vector<int64_t>& pads, double value,
                   const std::vector<double>& x, std::vector<double>& y) {
  const size_t rank = c.in.size();
  std::vector<int64_t> before(rank, 0);
  for (size_t j = 0; j < pads.size() / 2; ++j) before[rank - 1 - j] = pads[2 * j];
  y.assign(static_cast<size_t>(ir::numel_of(c.out)), 0.0);
  std::vector<int64_t> coord(rank, 0);
  for (size_t o = 0; o < y.size(); ++o) {
    int64_t rest = static_cast<int64_t>(o), src = 0, stride = 1;
    bool inside = true;
    for (size_t d = rank; d-- > 0;) {
      const int64_t j = rest % c.out[d];
      rest /= c.out[d];
      const int64_t in = c.in[d], pl = before[d];
      int64_t i = j - pl;
      if (mode == PadMode::kReflect) {
        // ATen reflection_pad: j < pad_l -> pad_l*2 - j; j >= in + pad_l -> (in + pad_l - 1)*2 - j
        int64_t ip = j < pl ? pl * 2 - j : (j < in + pl ? j : (in + pl - 1) * 2 - j);
        i = ip - pl;
      } else if (mode == PadMode::kReplicate) {
        i = std::min(std::max<int64_t>(i, 0), in - 1);
      } else if (i < 0 || i >= in) {
        inside = false;
      }
      src += i * stride;
      stride *= in;
    }
    y[o] = inside ? x[static_cast<size_t>(src)] : value;
  }
}

class ResampleKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("KILN_TEST_SEED");
    seed_ = env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
  }

  // Random inputs exactly representable in `d`.
  std::vector<float> random_input(DType d, int64_t n) {
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = static_cast<float>(round_to(d, dist(rng_)));
    return x;
  }

  // Compiles `c` computing in `compute` and compares the kernel with `ref`
  // (which fills y and per-element magnitudes from the input values).
  // Low-precision cases run on a graph of that dtype (float16 loads and
  // stores) unless `mixed`: a float32 graph computing in it (float32 loads).
  template <class Ref>
  void check(const Case& c, DType compute, const std::string& tag, Ref ref, bool mixed = false) {
    const DType graph_dtype = mixed ? DType::kFloat32 : compute;
    SCOPED_TRACE(describe(c) + " " + engine::dtype_name(compute) + (mixed ? " (float32 graph)" : "") +
                 ", KILN_TEST_SEED=" + std::to_string(seed_));
    ir::Graph g;
    ops::ResamplePlan plan;
    ASSERT_NO_THROW(plan = plan_of(c, compute, g, graph_dtype));
    const DType xd = g.value(plan.input).dtype, od = g.value(plan.out).dtype;
    EXPECT_EQ(g.value(plan.input).shape, c.in);
    EXPECT_EQ(g.value(plan.out).shape, c.out);
    std::vector<float> x = random_input(xd, ir::numel_of(c.in));
    std::vector<double> xd64(x.begin(), x.end()), y_ref, mag;
    ref(xd64, y_ref, mag);
    if (mag.empty())
      for (double v : y_ref) mag.push_back(std::fabs(v));
    EXPECT_EQ(xd, mixed ? DType::kFloat32 : compute);
    EXPECT_EQ(od, compute);
    const double eps = od == DType::kFloat32 ? 1e-5 : od == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
    HostKernel kernel(g, plan, tag);
    ASSERT_TRUE(kernel.ok());
    for (bool one_block : {false, true}) {
      SCOPED_TRACE(one_block ? "one block: grid-stride loop" : "the lowering's grid");
      std::vector<double> y = kernel.run(x, one_block);
      ASSERT_EQ(y.size(), y_ref.size());
      size_t bad = 0;
      double worst = 0;
      for (size_t o = 0; o < y.size(); ++o) {
        const double tol = eps * (std::fabs(y_ref[o]) + mag[o]) + 1e-7;
        worst = std::max(worst, std::fabs(y[o] - y_ref[o]) / (std::fabs(y_ref[o]) + mag[o] + 1e-30));
        if (!(std::fabs(y[o] - y_ref[o]) <= tol) && ++bad <= 5)
          ADD_FAILURE() << "element " << o << ": got " << y[o] << ", expected " << y_ref[o] << " (tol " << tol << ")";
      }
      EXPECT_EQ(bad, 0u);
      if (!one_block)
        std::cout << "  " << describe(c) << " " << engine::dtype_name(compute) << (mixed ? " (float32 graph)" : "")
                  << ": worst rel err " << worst << "\n";
    }
  }

  void check_interp(const Case& c, const Interp& m, DType compute, const std::string& tag, bool mixed = false) {
    check(c, compute, tag, [&](const std::vector<double>& x, std::vector<double>& y, std::vector<double>& mag) {
      reference_interp(c, m, x, y, mag);
    }, mixed);
  }

  void check_pad(const Case& c, PadMode mode, const std::vector<int64_t>& pads, double value, DType compute,
                 const std::string& tag, bool mixed = false) {
    check(c, compute, tag, [&](const std::vector<double>& x, std::vector<double>& y, std::vector<double>&) {
      reference_pad(c, mode, pads, value, x, y);
    }, mixed);
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
};

Case nearest_scale(std::vector<int64_t> in, double sh, double sw) {
  std::vector<int64_t> out = {in[0], in[1], static_cast<int64_t>(static_cast<double>(in[2]) * sh),
                              static_cast<int64_t>(static_cast<double>(in[3]) * sw)};
  return {"aten.upsample_nearest2d.vec", {{"scale_factors", std::vector<double>{sh, sw}}}, in, out, "nearest scale"};
}
Case nearest_size(std::vector<int64_t> in, int64_t p, int64_t q) {
  return {"aten.upsample_nearest2d.vec", {{"output_size", std::vector<int64_t>{p, q}}}, in, {in[0], in[1], p, q},
          "nearest size"};
}
Case bilinear_scale(std::vector<int64_t> in, double sh, double sw, bool align) {
  std::vector<int64_t> out = {in[0], in[1], static_cast<int64_t>(static_cast<double>(in[2]) * sh),
                              static_cast<int64_t>(static_cast<double>(in[3]) * sw)};
  return {"aten.upsample_bilinear2d.vec",
          {{"scale_factors", std::vector<double>{sh, sw}}, {"align_corners", align}},
          in,
          out,
          std::string("bilinear scale") + (align ? " align_corners" : "")};
}
Case bilinear_size(std::vector<int64_t> in, int64_t p, int64_t q, bool align) {
  return {"aten.upsample_bilinear2d.vec",
          {{"output_size", std::vector<int64_t>{p, q}}, {"align_corners", align}},
          in,
          {in[0], in[1], p, q},
          std::string("bilinear size") + (align ? " align_corners" : "")};
}

// PyTorch 2.14's own answers (F.interpolate on the CPU, inputs x[h, w] = h
// and x[h, w] = w): the source coordinate of each output row and column.
struct Golden {
  Case c;
  Interp m;
  std::vector<double> rows, cols;
};

TEST_F(ResampleKernel, MatchesPyTorchIndexTables) {
  const std::vector<Golden> golden = {
      {nearest_scale({1, 1, 5, 6}, 1.7, 1.7), {false, false, 1.7, 1.7},
       {0, 0, 1, 1, 2, 2, 3, 4}, {0, 0, 1, 1, 2, 2, 3, 4, 4, 5}},
      {nearest_size({1, 1, 5, 6}, 7, 9), {}, {0, 0, 1, 2, 2, 3, 4}, {0, 0, 1, 2, 2, 3, 4, 4, 5}},
      {nearest_scale({1, 1, 9, 7}, 0.45, 0.45), {false, false, 0.45, 0.45}, {0, 2, 4, 6}, {0, 2, 4}},
      {bilinear_scale({1, 1, 5, 6}, 1.5, 1.5, false), {true, false, 1.5, 1.5},
       {0, 0.5, 1.16666675, 1.83333337, 2.5, 3.16666675, 3.83333349},
       {0, 0.5, 1.16666675, 1.83333337, 2.5, 3.16666675, 3.83333349, 4.5, 5}},
      {bilinear_size({1, 1, 5, 6}, 11, 13, true), {true, true},
       {0, 0.400000006, 0.800000012, 1.20000005, 1.60000002, 2, 2.4000001, 2.79999995, 3.20000005, 3.60000014, 4},
       {0, 0.416666657, 0.833333313, 1.25, 1.66666663, 2.08333325, 2.5, 2.91666651, 3.33333325, 3.75, 4.16666651,
        4.58333302, 5}},
      {bilinear_size({1, 1, 9, 7}, 4, 3, false), {true, false}, {0.625, 2.875, 5.125, 7.375},
       {0.666666627, 3, 5.33333302}},
      {bilinear_scale({1, 1, 5, 6}, 2.3, 2.3, false), {true, false, 2.3, 2.3},
       {0, 0.152173892, 0.586956501, 1.02173913, 1.45652163, 1.89130425, 2.32608676, 2.7608695, 3.19565201,
        3.63043475, 4},
       {0, 0.152173892, 0.586956501, 1.02173913, 1.45652163, 1.89130425, 2.32608676, 2.7608695, 3.19565201,
        3.63043475, 4.06521702, 4.5, 4.93478251}},
  };
  for (size_t k = 0; k < golden.size(); ++k) {
    const Golden& t = golden[k];
    SCOPED_TRACE(describe(t.c));
    ASSERT_EQ(t.rows.size(), static_cast<size_t>(t.c.out[2]));
    ASSERT_EQ(t.cols.size(), static_cast<size_t>(t.c.out[3]));
    ir::Graph g;
    ops::ResamplePlan plan = plan_of(t.c, DType::kFloat32, g);
    HostKernel kernel(g, plan, "golden" + std::to_string(k));
    ASSERT_TRUE(kernel.ok());
    const int64_t H = t.c.in[2], W = t.c.in[3];
    for (int axis = 0; axis < 2; ++axis) {
      std::vector<float> x(static_cast<size_t>(H * W));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) x[static_cast<size_t>(h * W + w)] = static_cast<float>(axis == 0 ? h : w);
      std::vector<double> y = kernel.run(x);
      ASSERT_EQ(y.size(), t.rows.size() * t.cols.size());
      for (size_t p = 0; p < t.rows.size(); ++p)
        for (size_t q = 0; q < t.cols.size(); ++q) {
          const double want = axis == 0 ? t.rows[p] : t.cols[q];
          EXPECT_NEAR(y[p * t.cols.size() + q], want, 2e-6) << "row " << p << " col " << q << " axis " << axis;
        }
      // The reference agrees with PyTorch too.
      std::vector<double> xr(x.begin(), x.end()), yr, mag;
      reference_interp(t.c, t.m, xr, yr, mag);
      for (size_t o = 0; o < yr.size(); ++o) EXPECT_NEAR(yr[o], y[o], 2e-6) << "reference, element " << o;
    }
  }
}

TEST_F(ResampleKernel, UpsampleMatchesReference) {
  struct T {
    Case c;
    Interp m;
  };
  const std::vector<T> cases = {
      {nearest_scale({2, 3, 5, 7}, 2.0, 2.0), {false, false, 2.0, 2.0}},             // x2: dst >> 1
      {nearest_size({2, 3, 5, 7}, 12, 9), {}},                                        // to a size
      {nearest_scale({1, 4, 6, 5}, 1.7, 2.6), {false, false, 1.7, 2.6}},             // scale != in/out
      {nearest_scale({1, 2, 9, 8}, 0.5, 0.75), {false, false, 0.5, 0.75}},           // down
      {bilinear_scale({2, 3, 5, 7}, 2.0, 2.0, false), {true, false, 2.0, 2.0}},      // segmentation x2
      {bilinear_scale({1, 4, 6, 5}, 1.7, 2.3, false), {true, false, 1.7, 2.3}},      // non-integer
      {bilinear_scale({1, 4, 6, 5}, 1.7, 2.3, true), {true, true, 1.7, 2.3}},        // align_corners
      {bilinear_size({2, 3, 4, 4}, 32, 29, false), {true, false}},                   // 8x to a size
      {bilinear_size({1, 3, 13, 11}, 5, 11, true), {true, true}},                    // down; w unchanged
      {bilinear_size({1, 2, 1, 1}, 6, 5, false), {true, false}},                     // 1x1 broadcast (ASPP)
      {bilinear_size({1, 2, 7, 6}, 1, 3, true), {true, true}},                       // output of 1: align scale 0
  };
  for (size_t i = 0; i < cases.size(); ++i) check_interp(cases[i].c, cases[i].m, DType::kFloat32, "up" + std::to_string(i));
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    for (size_t i : {0u, 5u, 6u, 7u})
      check_interp(cases[i].c, cases[i].m, d, "up" + std::to_string(i) + engine::dtype_name(d));
    check_interp(cases[4].c, cases[4].m, d, "up4mixed" + std::string(engine::dtype_name(d)), /*mixed=*/true);
  }
}

TEST_F(ResampleKernel, DefaultOverloadsTakeScalesHAndW) {
  // upsample_*2d.default(input, output_size, [align_corners,] scales_h, scales_w)
  Case n{"aten.upsample_nearest2d.default",
         {{"output_size", std::vector<int64_t>{8, 10}}, {"scales_h", 1.7}, {"scales_w", 1.7}},
         {1, 2, 5, 6}, {1, 2, 8, 10}, "nearest .default scales"};
  check_interp(n, {false, false, 1.7, 1.7}, DType::kFloat32, "def_n");
  Case b{"aten.upsample_bilinear2d.default",
         {{"output_size", std::vector<int64_t>{11, 13}}, {"align_corners", false}},
         {1, 2, 5, 6}, {1, 2, 11, 13}, "bilinear .default no scales"};
  check_interp(b, {true, false}, DType::kFloat32, "def_b");
}

Case pad_case(const std::string& op, const std::vector<int64_t>& in, const std::vector<int64_t>& pads, double value = 0) {
  std::vector<int64_t> out = in;
  for (size_t j = 0; j < pads.size() / 2; ++j) out[in.size() - 1 - j] += pads[2 * j] + pads[2 * j + 1];
  std::map<std::string, ir::Attr> attrs;
  if (op == "aten.constant_pad_nd.default") {
    attrs["pad"] = pads;
    attrs["value"] = value;
  } else {
    attrs["padding"] = pads;
  }
  return {op, attrs, in, out, op.substr(5, op.find('.', 5) - 5)};
}

TEST_F(ResampleKernel, PadsMatchReference) {
  struct T {
    std::string op;
    std::vector<int64_t> in, pads;
    PadMode mode;
    double value;
  };
  const std::string cpad = "aten.constant_pad_nd.default";
  const std::vector<T> cases = {
      {cpad, {2, 3, 5, 6}, {1, 2, 3, 4}, PadMode::kConstant, 0.5},           // 2-D with a value
      {cpad, {2, 3, 5, 6}, {0, 0, 0, 0, 1, 2}, PadMode::kConstant, -1.25},   // the channel dim
      {cpad, {2, 3, 5, 6}, {1, -2, -1, 3}, PadMode::kConstant, 0.0},         // negative: cropping
      {cpad, {4, 7}, {2, 1, 1, 0}, PadMode::kConstant, 3.0},                 // every dim of a 2-D tensor
      {cpad, {2, 3, 2, 3, 4}, {1, 1, 0, 0, 2, 0}, PadMode::kConstant, 7.0},  // 5-D, a gap in the padded dims
      {"aten.reflection_pad1d.default", {2, 3, 8}, {3, 2}, PadMode::kReflect, 0},
      {"aten.reflection_pad1d.default", {3, 5}, {4, 4}, PadMode::kReflect, 0},  // 2-D input, pad = in - 1
      {"aten.reflection_pad2d.default", {2, 3, 5, 6}, {1, 2, 3, 4}, PadMode::kReflect, 0},
      {"aten.reflection_pad2d.default", {3, 4, 4}, {3, 0, 0, 2}, PadMode::kReflect, 0},
      {"aten.reflection_pad3d.default", {1, 2, 3, 4, 5}, {1, 1, 2, 0, 1, 2}, PadMode::kReflect, 0},
      {"aten.replication_pad1d.default", {2, 3, 4}, {5, 1}, PadMode::kReplicate, 0},
      {"aten.replication_pad2d.default", {2, 3, 5, 6}, {2, 7, 0, 3}, PadMode::kReplicate, 0},
      {"aten.replication_pad3d.default", {1, 2, 3, 4, 2}, {1, 2, 0, 1, 3, 0}, PadMode::kReplicate, 0},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const T& t = cases[i];
    check_pad(pad_case(t.op, t.in, t.pads, t.value), t.mode, t.pads, t.value, DType::kFloat32, "pad" + std::to_string(i));
  }
  for (DType d : {DType::kFloat16, DType::kBFloat16})
    for (size_t i : {0u, 7u, 11u}) {
      const T& t = cases[i];
      check_pad(pad_case(t.op, t.in, t.pads, t.value), t.mode, t.pads, t.value, d,
                "pad" + std::to_string(i) + engine::dtype_name(d), /*mixed=*/i == 11);
    }
}

std::optional<std::string> ask(const Case& c) {
  compiler::OpQuery q;
  q.op = c.op;
  q.inputs = {{DType::kFloat32, c.in, false}};
  q.attrs = c.attrs;
  q.outputs = {{DType::kFloat32, c.out, false}};
  return compiler::check_support(q);
}

TEST(ResampleCheck, RefusesWhatItCannotCompute) {
  auto refused = [](const Case& c, const std::string& words) {
    auto why = ask(c);
    ASSERT_TRUE(why.has_value()) << describe(c) << " was taken";
    EXPECT_NE(why->find(words), std::string::npos) << *why;
  };
  EXPECT_EQ(ask(nearest_scale({1, 2, 5, 6}, 2.0, 2.0)), std::nullopt);
  EXPECT_EQ(ask(bilinear_size({1, 2, 5, 6}, 9, 4, true)), std::nullopt);
  EXPECT_EQ(ask(pad_case("aten.constant_pad_nd.default", {2, 5}, {-1, 2, 1, 1}, 1.0)), std::nullopt);
  refused(pad_case("aten.reflection_pad1d.default", {2, 3, 4}, {4, 1}), "smaller than the padded dimension");
  refused(pad_case("aten.reflection_pad2d.default", {2, 3, 5, 6}, {-1, 1, 0, 0}), "negative padding");
  refused(pad_case("aten.replication_pad1d.default", {2, 3, 5, 6}, {1, 1}), "needs a 2-D or 3-D input");
  Case five_d = nearest_size({1, 2, 5, 6}, 7, 8);
  five_d.in = {1, 1, 2, 5, 6};
  five_d.out = {1, 1, 2, 7, 8};
  refused(five_d, "4-D");
  Case wrong = nearest_size({1, 2, 5, 6}, 7, 8);
  wrong.out = {1, 2, 7, 9};
  refused(wrong, "output_size does not match");
  Case empty = pad_case("aten.constant_pad_nd.default", {2, 5}, {-3, -2});
  refused(empty, "empty output");
}

// A conv stack around the ops: convs run channels-last, the resample/pad
// reads NCHW (a layout kernel before it), and NVRTC compiles the module.
TEST(ResamplePipeline, CompilesToOneKernelStepEach) {
  std::mt19937 rng(1);
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {1, 4, 6, 6});
  int w = g.add_constant("w", DType::kFloat32, {8, 4, 3, 3}, testing::random_float_bytes(8 * 4 * 9, rng));
  std::map<std::string, ir::Attr> conv = {{"stride", std::vector<int64_t>{1, 1}},
                                          {"padding", std::vector<int64_t>{1, 1}},
                                          {"dilation", std::vector<int64_t>{1, 1}},
                                          {"transposed", false},
                                          {"output_padding", std::vector<int64_t>{0, 0}},
                                          {"groups", int64_t{1}}};
  auto add1 = [&](const std::string& op, const std::string& name, std::vector<int> in,
                  std::map<std::string, ir::Attr> attrs, std::vector<int64_t> shape) {
    int n = g.add_node(op, name, std::move(in), std::move(attrs), {{DType::kFloat32, std::move(shape)}});
    return g.nodes()[static_cast<size_t>(n)].outputs[0];
  };
  int y = add1("aten.convolution.default", "conv", {x, w}, conv, {1, 8, 6, 6});
  int p = add1("aten.reflection_pad2d.default", "pad", {y}, {{"padding", std::vector<int64_t>{1, 1, 1, 1}}},
               {1, 8, 8, 8});
  int u = add1("aten.upsample_bilinear2d.vec", "up", {p},
               {{"output_size", std::vector<int64_t>{12, 12}}, {"align_corners", false}}, {1, 8, 12, 12});
  g.set_outputs({u});
  for (DType precision : {DType::kFloat32, DType::kFloat16}) {
    compiler::CompileOptions options;
    options.enabled_precisions = {precision};
    engine::EngineDesc d = compiler::compile_to_desc(g, options);
    EXPECT_EQ(testing::count_label(d, "reflection_pad2d"), 1u);
    EXPECT_EQ(testing::count_label(d, "upsample_bilinear2d"), 1u);
    for (const auto& s : d.steps) {
      if (s.label != "upsample_bilinear2d") continue;
      ASSERT_EQ(s.kind, engine::StepKind::kKernel);
      ASSERT_EQ(s.kernel.args.size(), 3u) << "out, in, n";
      EXPECT_EQ(s.kernel.args[2].i64, 8 * 12 * 12);
      EXPECT_EQ(d.tensors[s.kernel.args[0].tensor].shape, (std::vector<int64_t>{1, 8, 12, 12}));
    }
    ASSERT_EQ(d.modules.size(), 1u);
    EXPECT_NE(d.modules[0].ptx.find("kiln_resample_"), std::string::npos);
  }
}

// A pad of width 0 on every side (Swin's pad to whole windows) is no step:
// its output is the input's storage. Widths that cancel out (crop one side,
// pad the other) keep the shape but move data, so they stay a step.
TEST(ResamplePipeline, ZeroWidthPadIsNoStep) {
  for (std::vector<int64_t> pads : {std::vector<int64_t>{0, 0, 0, 0}, std::vector<int64_t>{-1, 1, 0, 0}}) {
    ir::Graph g;
    int x = g.add_input("x", DType::kFloat32, {1, 4, 6, 6});
    int n = g.add_node("aten.constant_pad_nd.default", "pad", {x}, {{"pad", pads}, {"value", 0.0}},
                       {{DType::kFloat32, {1, 4, 6, 6}}});
    int p = g.nodes()[static_cast<size_t>(n)].outputs[0];
    int r = g.add_node("aten.relu.default", "relu", {p}, {}, {{DType::kFloat32, {1, 4, 6, 6}}});
    g.set_outputs({g.nodes()[static_cast<size_t>(r)].outputs[0]});
    compiler::CompileOptions options;
    engine::EngineDesc d = compiler::compile_to_desc(g, options);
    const bool zero = pads[0] == 0;
    EXPECT_EQ(testing::count_label(d, "constant_pad_nd"), zero ? 0u : 1u) << "pads " << pads[0] << "," << pads[1];
    EXPECT_EQ(d.steps.size(), zero ? 1u : 2u);
  }
}

}  // namespace
}  // namespace kiln
