// Gather kernels (embedding, index_select, gather, index.Tensor) and integer
// elementwise kernels, no GPU needed: the generated CUDA source is compiled as
// host C++ through cuda_host_shim.h and run on the CPU thread by thread, on
// fresh random data and indices (out-of-range and negative ones too), and
// compared with references written here: a gather reads exactly the element
// PyTorch's indexing names (indices wrapped once, then clamped: the
// documented behaviour for indices PyTorch would refuse), byte for byte;
// integer chains compute exactly (values past 2^24, where float would round).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/elementwise_kernel.h"
#include "ops/gather_kernel.h"
#include "ops/gather_ops.h"
#include "passes/passes.h"

#ifndef KILN_SHIM_HEADER
#error "KILN_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using Shape = std::vector<int64_t>;

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> r(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) r[d - 1] = r[d] * s[d];
  return r;
}

// Runs kernel `fn` (its source `src`) with `args` on the CPU.
void run_host(const std::string& src, const std::string& fn, const std::string& tag, void** args, unsigned grid,
              unsigned block) {
  testing::run_host_kernel(src, fn, tag, args, grid, block, KILN_SHIM_HEADER);
}

struct GatherCase {
  std::string op, what;
  Shape data;
  std::vector<Shape> indices;
  Shape out;
  std::map<std::string, ir::Attr> attrs;
  int64_t lo, hi;  // index values drawn from [lo, hi]
};

// The reference: out[o] = data[coords], indices wrapped once and clamped.
std::vector<float> reference(const GatherCase& c, const std::vector<float>& data,
                             const std::vector<std::vector<int64_t>>& idx) {
  const Shape& out = c.out;
  const size_t n = c.data.size(), r = out.size();
  const std::vector<int64_t> ds = strides_of(c.data);
  auto fix = [](int64_t v, int64_t size) {
    if (v < 0) v += size;
    return std::min(std::max<int64_t>(v, 0), size - 1);
  };
  // An index tensor's element at output coordinate `o` (broadcast over the
  // output dims [first, first + rank)).
  auto at = [&](size_t k, const std::vector<int64_t>& o, size_t first, size_t rank) {
    const Shape& s = c.indices[k];
    const std::vector<int64_t> st = strides_of(s);
    int64_t off = 0;
    for (size_t j = 0; j < s.size(); ++j)
      if (s[j] != 1) off += o[first + rank - s.size() + j] * st[j];
    return idx[k][static_cast<size_t>(off)];
  };
  std::vector<float> y(static_cast<size_t>(ir::numel_of(out)));
  std::vector<int64_t> o(r, 0);
  for (size_t flat = 0; flat < y.size(); ++flat) {
    int64_t rest = static_cast<int64_t>(flat);
    for (size_t j = r; j-- > 0;) {
      o[j] = rest % out[j];
      rest /= out[j];
    }
    std::vector<int64_t> src(n, 0);
    if (c.op == "aten.embedding.default") {
      src = {fix(at(0, o, 0, c.indices[0].size()), c.data[0]), o[r - 1]};
    } else if (c.op == "aten.index.Tensor") {
      // PyTorch's advanced indexing: the output is the non-indexed dims
      // before the indexed ones, the broadcast index dims, the rest; or,
      // when the indexed dims are not next to each other, the index dims
      // first and then every non-indexed dim.
      size_t b = 0;
      for (const Shape& s : c.indices) b = std::max(b, s.size());
      std::vector<int64_t> pos;
      if (c.attrs.count("indices_positions")) pos = std::get<std::vector<int64_t>>(c.attrs.at("indices_positions"));
      for (size_t k = pos.size(); k < c.indices.size(); ++k) pos.push_back(static_cast<int64_t>(k));
      const bool adjacent = pos.back() - pos.front() == static_cast<int64_t>(pos.size()) - 1;
      std::vector<size_t> before, after;  // non-indexed data dims around the index dims
      for (size_t s = 0; s < n; ++s)
        if (std::find(pos.begin(), pos.end(), static_cast<int64_t>(s)) == pos.end())
          (adjacent && static_cast<int64_t>(s) < pos.front() ? before : after).push_back(s);
      size_t q = 0;
      for (size_t s : before) src[s] = o[q++];
      const size_t first = q;
      q += b;
      for (size_t s : after) src[s] = o[q++];
      for (size_t k = 0; k < pos.size(); ++k)
        src[static_cast<size_t>(pos[k])] = fix(at(k, o, first, b), c.data[static_cast<size_t>(pos[k])]);
    } else {
      int64_t d = std::get<int64_t>(c.attrs.at("dim"));
      if (d < 0) d += static_cast<int64_t>(n);
      for (size_t s = 0; s < n; ++s) src[s] = o[s];
      const int64_t v = c.op == "aten.gather.default" ? at(0, o, 0, r) : idx[0][static_cast<size_t>(o[d])];
      src[static_cast<size_t>(d)] = fix(v, c.data[static_cast<size_t>(d)]);
    }
    int64_t off = 0;
    for (size_t s = 0; s < n; ++s) off += src[s] * ds[s];
    y[flat] = data[static_cast<size_t>(off)];
  }
  return y;
}

void check_gather(const GatherCase& c, DType index_dtype, size_t misalign) {
  SCOPED_TRACE(c.what + (index_dtype == DType::kInt32 ? " int32" : " int64") +
               (misalign ? " misaligned" : ""));
  ir::Graph g;
  std::vector<int> ins{g.add_input("data", DType::kFloat32, c.data)};
  for (size_t k = 0; k < c.indices.size(); ++k) ins.push_back(g.add_input("idx" + std::to_string(k), index_dtype, c.indices[k]));
  std::map<std::string, ir::Attr> attrs = c.attrs;
  if (c.op == "aten.index.Tensor") attrs["indices_count"] = static_cast<int64_t>(c.indices.size());
  int node = g.add_node(c.op, "op", ins, attrs, {{DType::kFloat32, c.out}});
  g.set_outputs({g.nodes()[static_cast<size_t>(node)].outputs[0]});
  passes::ExecPlan plan = passes::fuse(g);
  ASSERT_EQ(plan.ops.size(), 1u);
  const ops::GatherPlan* p = plan.ops[0].as<ops::GatherPlan>();
  ASSERT_NE(p, nullptr);
  ops::GatherLaunch launch;
  const std::string src = ops::generate_gather_kernel(g, *p, "kiln_gather_test", &launch);

  std::mt19937_64 rng(std::random_device{}());
  std::vector<float> data(static_cast<size_t>(ir::numel_of(c.data)));
  std::normal_distribution<float> normal;
  for (float& v : data) v = normal(rng);
  std::uniform_int_distribution<int64_t> pick(c.lo, c.hi);
  std::vector<std::vector<int64_t>> idx;
  std::vector<std::vector<uint8_t>> idx_bytes;
  for (const Shape& s : c.indices) {
    idx.emplace_back(static_cast<size_t>(ir::numel_of(s)));
    for (int64_t& v : idx.back()) v = pick(rng);
    idx_bytes.emplace_back(idx.back().size() * engine::dtype_size(index_dtype));
    for (size_t i = 0; i < idx.back().size(); ++i) {
      if (index_dtype == DType::kInt32) {
        int32_t v = static_cast<int32_t>(idx.back()[i]);
        std::memcpy(idx_bytes.back().data() + 4 * i, &v, 4);
      } else {
        std::memcpy(idx_bytes.back().data() + 8 * i, &idx.back()[i], 8);
      }
    }
  }
  // Buffers offset by `misalign` bytes (4: still float-aligned) to take the
  // element-by-element path.
  std::vector<uint8_t> data_buf(data.size() * 4 + 16), out_buf(static_cast<size_t>(ir::numel_of(c.out)) * 4 + 16, 0xff);
  uint8_t* data_ptr = data_buf.data() + (16 - reinterpret_cast<uintptr_t>(data_buf.data()) % 16) % 16 + misalign;
  uint8_t* out_ptr = out_buf.data() + (16 - reinterpret_cast<uintptr_t>(out_buf.data()) % 16) % 16;
  std::memcpy(data_ptr, data.data(), data.size() * 4);
  std::vector<void*> ptrs{out_ptr, data_ptr};
  for (auto& b : idx_bytes) ptrs.push_back(b.data());
  long long n = ir::numel_of(c.out);
  std::vector<void*> args;
  for (void*& q : ptrs) args.push_back(&q);
  args.push_back(&n);
  run_host(src, "kiln_gather_test", "gather", args.data(), launch.grid, ops::kGatherBlock);

  const std::vector<float> want = reference(c, data, idx);
  std::vector<float> got(want.size());
  std::memcpy(got.data(), out_ptr, got.size() * 4);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

std::vector<GatherCase> gather_cases() {
  std::vector<GatherCase> cases;
  cases.push_back({"aten.embedding.default", "embedding rows of 64 floats", {50, 64}, {{2, 7}}, {2, 7, 64}, {}, 0, 49});
  cases.push_back({"aten.embedding.default", "embedding rows of 5 floats, bad ids", {9, 5}, {{13}}, {13, 5}, {}, -12, 20});
  cases.push_back({"aten.index_select.default", "index_select dim 1", {3, 10, 6}, {{4}}, {3, 4, 6}, {{"dim", int64_t{1}}}, -10, 9});
  cases.push_back({"aten.index_select.default", "index_select last dim", {3, 4, 6}, {{5}}, {3, 4, 5}, {{"dim", int64_t{-1}}}, 0, 7});
  cases.push_back({"aten.gather.default", "gather dim 1, smaller index", {3, 8, 6}, {{3, 5, 4}}, {3, 5, 4}, {{"dim", int64_t{1}}}, 0, 7});
  cases.push_back({"aten.gather.default", "gather dim 0", {4, 6}, {{7, 6}}, {7, 6}, {{"dim", int64_t{0}}}, -4, 5});
  cases.push_back({"aten.index.Tensor", "index two broadcast tensors", {5, 6, 8}, {{4, 1}, {3}}, {4, 3, 8}, {}, -6, 5});
  cases.push_back({"aten.index.Tensor", "index one tensor (a table lookup)", {169, 3}, {{49, 49}}, {49, 49, 3}, {}, 0, 168});
  // x[:, :, idx] (Falcon's rotary tables): [None, None, idx].
  cases.push_back({"aten.index.Tensor", "index dim 2 only", {2, 3, 7, 4}, {{5}}, {2, 3, 5, 4},
                   {{"indices_positions", std::vector<int64_t>{2}}}, -7, 6});
  // x[:, i, j] with i, j broadcast: the index dims where dim 1 was.
  cases.push_back({"aten.index.Tensor", "index dims 1 and 2", {2, 5, 6, 3}, {{4, 1}, {3}}, {2, 4, 3, 3},
                   {{"indices_positions", std::vector<int64_t>{1, 2}}}, 0, 4});
  // x[i, :, j]: indexed dims apart, so the index dims come first.
  cases.push_back({"aten.index.Tensor", "index dims 0 and 2", {5, 3, 6}, {{4}, {4}}, {4, 3},
                   {{"indices_positions", std::vector<int64_t>{0, 2}}}, 0, 4});
  return cases;
}

TEST(GatherKernel, MatchesTheReference) {
  for (const GatherCase& c : gather_cases())
    for (DType d : {DType::kInt64, DType::kInt32}) check_gather(c, d, 0);
}

TEST(GatherKernel, MisalignedBuffersTakeTheElementPath) {
  for (const GatherCase& c : gather_cases()) check_gather(c, DType::kInt64, 4);
}

TEST(GatherKernel, CapabilityCheckRefusesBoolIndicesAndBadShapes) {
  ops::OpQuery q;
  q.op = "aten.index.Tensor";
  q.inputs = {{DType::kFloat32, {4, 5}, false}, {DType::kBool, {4, 5}, false}};
  q.outputs = {{DType::kFloat32, {7}, false}};
  EXPECT_NE(compiler::check_support(q), std::nullopt);
  q.op = "aten.embedding.default";
  q.inputs = {{DType::kFloat32, {10, 4}, true}, {DType::kFloat32, {3}, false}};
  q.outputs = {{DType::kFloat32, {3, 4}, false}};
  auto why = compiler::check_support(q);
  ASSERT_NE(why, std::nullopt);
  EXPECT_NE(why->find("int64 or int32"), std::string::npos) << *why;
  q.inputs[1].dtype = DType::kInt64;
  EXPECT_EQ(compiler::check_support(q), std::nullopt);
  q.outputs[0].shape = {3, 5};
  EXPECT_NE(compiler::check_support(q), std::nullopt);
}

// A float32 graph input gathered in a float16 engine: element by element
// with the conversion (round to nearest even).
TEST(GatherKernel, ConvertsFloat32DataToFloat16) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {6, 8});
  int i = g.add_input("i", DType::kInt64, {5});
  int node = g.add_node("aten.index_select.default", "op", {x, i}, {{"dim", int64_t{0}}}, {{DType::kFloat16, {5, 8}}});
  const ops::GatherPlan p = ops::plan_gather(g, g.nodes()[static_cast<size_t>(node)]);
  ops::GatherLaunch launch;
  const std::string src = ops::generate_gather_kernel(g, p, "kiln_gather_test", &launch);
  std::vector<float> data(48);
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (float& v : data) v = normal(rng);
  std::vector<int64_t> idx{5, 0, -1, 9, 2};
  std::vector<uint8_t> out(80, 0xff);
  void* out_ptr = out.data();
  void* data_ptr = data.data();
  void* idx_ptr = idx.data();
  long long n = 40;
  void* args[] = {&out_ptr, &data_ptr, &idx_ptr, &n};
  run_host(src, "kiln_gather_test", "convert", args, launch.grid, ops::kGatherBlock);
  const int64_t rows[] = {5, 0, 5, 5, 2};  // -1 wraps to 5, 9 clamps to 5
  for (size_t r = 0; r < 5; ++r)
    for (size_t c = 0; c < 8; ++c)
      ASSERT_EQ(testing::read_elem(DType::kFloat16, out, r * 8 + c),
                testing::round_to(DType::kFloat16, data[static_cast<size_t>(rows[r]) * 8 + c]))
          << r << "," << c;
}

// int64 arithmetic, bitwise ops, exact compares, where and casts in one
// fused kernel, on values past 2^24 (float would round them).
TEST(IntegerElementwise, ComputesExactly) {
  ir::Graph g;
  const Shape s{64};
  int a = g.add_input("a", DType::kInt64, s), b = g.add_input("b", DType::kInt64, s);
  auto node = [&](const std::string& op, std::vector<int> in, std::map<std::string, ir::Attr> attrs, DType d) {
    int n = g.add_node(op, op + std::to_string(g.nodes().size()), std::move(in), std::move(attrs), {{d, s}});
    return g.nodes()[static_cast<size_t>(n)].outputs[0];
  };
  int sum = node("aten.add.Tensor", {a, b}, {{"alpha", int64_t{3}}}, DType::kInt64);            // a + 3b
  int prod = node("aten.mul.Scalar", {sum}, {{"other", int64_t{5}}}, DType::kInt64);             // *5
  int bits = node("aten.bitwise_xor.Tensor", {prod, a}, {}, DType::kInt64);
  int eq = node("aten.eq.Tensor", {bits, prod}, {}, DType::kBool);                               // exact
  int ge = node("aten.ge.Scalar", {a, }, {{"other", int64_t{16777217}}}, DType::kBool);
  int both = node("aten.logical_or.default", {eq, ge}, {}, DType::kBool);
  int pick = node("aten.where.self", {both, bits, b}, {}, DType::kInt64);
  int neg = node("aten.neg.default", {pick}, {}, DType::kInt64);
  int f = node("aten._to_copy.default", {neg}, {{"dtype", std::string("float32")}}, DType::kFloat32);
  int back = node("aten._to_copy.default", {f}, {{"dtype", std::string("int64")}}, DType::kInt64);  // float -> int truncates
  int out = node("aten.sub.Tensor", {neg, back}, {}, DType::kInt64);  // the float round trip's error
  g.set_outputs({pick, out});
  passes::ExecPlan plan = passes::fuse(g);

  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> big(-(int64_t{1} << 40), int64_t{1} << 40);
  std::vector<int64_t> av(64), bv(64);
  for (size_t i = 0; i < 64; ++i) {
    av[i] = i % 4 == 0 ? 16777217 + static_cast<int64_t>(i) : big(rng);
    bv[i] = i % 8 == 1 ? 0 : big(rng);
  }
  std::map<int, std::vector<int64_t>> values{{a, av}, {b, bv}};
  for (const ops::PlannedOp& op : plan.ops) {
    const ops::PointwisePlan* p = op.as<ops::PointwisePlan>();
    ASSERT_NE(p, nullptr) << op.label;
    const std::string src = ops::generate_pointwise_kernel(g, *p, "kiln_int_test");
    const ir::Value& ov = g.value(p->out);
    ASSERT_EQ(ov.dtype, DType::kInt64);
    std::vector<int64_t> result(64, -1);
    std::vector<std::vector<int64_t>> inputs;
    for (int in : p->inputs) inputs.push_back(values.at(in));
    std::vector<void*> ptrs{result.data()};
    for (auto& v : inputs) ptrs.push_back(v.data());
    long long n = 64;
    std::vector<void*> args;
    for (void*& q : ptrs) args.push_back(&q);
    args.push_back(&n);
    run_host(src, "kiln_int_test", "int", args.data(), 1, ops::kPointwiseBlock);
    values[p->out] = result;
  }
  for (size_t i = 0; i < 64; ++i) {
    const int64_t x = av[i], y = bv[i];
    const int64_t pr = (x + 3 * y) * 5, bt = pr ^ x;
    const bool keep = bt == pr || x >= 16777217;
    const int64_t pk = keep ? bt : y;
    EXPECT_EQ(values.at(pick)[i], pk) << i;
    const int64_t ng = -pk;
    EXPECT_EQ(values.at(out)[i], ng - static_cast<int64_t>(static_cast<float>(ng))) << i;
  }
}

}  // namespace
}  // namespace kiln
