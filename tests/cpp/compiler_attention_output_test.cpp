// Attention writing its output through the heads merge after it: grouped-
// query attention runs a kv head's q heads as one block of rows
// ([B, kv heads, group * tokens, D]); the view -> permute -> clone -> view
// that makes [B, tokens, heads * D] of it is absorbed, and the kernel writes
// each row at its head's place (AttentionPlan::out_row_block). The kernels
// (SIMT rows and decode-shaped) run on the CPU through cuda_block_shim.h and
// are compared with a reference on fresh random inputs.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/attention_kernel.h"
#include "ops/attention_ops.h"
#include "passes/passes.h"

#ifndef KILN_BLOCK_SHIM_HEADER
#error "KILN_BLOCK_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using Shape = std::vector<int64_t>;
using testing::out0;
using testing::read_elem;
using testing::round_to;
using testing::write_elem;


struct Case {
  int64_t kv_heads, group, tokens, keys, dim;
};

void check_grouped_rows_output(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE("kv_heads " + std::to_string(c.kv_heads) + " group " + std::to_string(c.group) + " tokens " +
               std::to_string(c.tokens) + " keys " + std::to_string(c.keys));
  const DType dt = DType::kFloat32;
  const int64_t heads = c.kv_heads * c.group, rows = c.group * c.tokens;
  ir::Graph g;
  const int q = g.add_input("q", dt, {1, c.kv_heads, rows, c.dim});
  const int k = g.add_input("k", dt, {1, c.kv_heads, c.keys, c.dim});
  const int v = g.add_input("v", dt, {1, c.kv_heads, c.keys, c.dim});
  const int att = out0(g, g.add_node(ops::kSdpaOp, "sdpa", {q, k, v}, {}, {{dt, {1, c.kv_heads, rows, c.dim}}}));
  const int per_head = out0(g, g.add_node("aten.view_copy.default", "view", {att}, {{"size", Shape{1, heads, c.tokens, c.dim}}},
                                          {{dt, {1, heads, c.tokens, c.dim}}}));
  const int perm = out0(g, g.add_node("aten.permute_copy.default", "perm", {per_head}, {{"dims", Shape{0, 2, 1, 3}}},
                                      {{dt, {1, c.tokens, heads, c.dim}}}));
  const int clone = out0(g, g.add_node("aten.clone.default", "clone", {perm}, {}, {{dt, {1, c.tokens, heads, c.dim}}}));
  const int merged = out0(g, g.add_node("aten.view_copy.default", "merge", {clone}, {{"size", Shape{1, c.tokens, heads * c.dim}}},
                                        {{dt, {1, c.tokens, heads * c.dim}}}));
  g.set_outputs({merged});
  passes::ExecPlan plan = passes::fuse(g);
  const auto* p = plan.ops[0].as<ops::AttentionPlan>();
  ASSERT_NE(p, nullptr);
  // A decode-shaped attention splits its keys over blocks and merges them
  // in a second step, which then writes the output.
  ASSERT_EQ(plan.ops.size(), p->splits > 1 ? 2u : 1u) << "the heads merge must be written by the attention, not copied";
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(plan.storage_of(p->out), plan.storage_of(merged));
  EXPECT_EQ(p->out_row_block, c.tokens);
  EXPECT_EQ(p->out_row_block_stride, c.dim);                 // the next q head of the group
  EXPECT_EQ(p->out_strides[2], heads * c.dim);               // the next token
  EXPECT_EQ(p->out_strides[1], c.group * c.dim);             // the next kv head's first q head

  const bool decode = ops::attention_is_decode(*p);
  EXPECT_EQ(decode, p->splits > 1);
  ops::AttentionKernel gen = ops::generate_attention_kernel(*p, "kiln_attention_rows_test");
  std::string src = gen.source.substr(gen.source.find("// kiln_attention_rows_test"));
  src = "#define KILN_NEG_INF (-INFINITY)\n" + src;
  ops::AttentionKernel combine;
  if (p->splits > 1) {
    combine = ops::generate_attention_combine_kernel(*p, "kiln_attention_rows_combine_test");
    src += combine.source +
           "\nextern \"C\" void kiln_test_combine(void** args, unsigned block) {\n"
           "  kiln_shim_launch_blocks(&kiln_attention_rows_combine_test, args, 1, block);\n}\n";
  }
  const std::string wrapped = testing::host_prelude() + src +
                              "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block) {\n"
                              "  kiln_shim_launch_blocks(&kiln_attention_rows_test, args, grid, block,\n"
                              "      kiln_shim::Order::kLowWarpFirst);\n}\n";
  void* lib = testing::build_host_module(wrapped, decode ? "attention_rows_decode" : "attention_rows", KILN_BLOCK_SHIM_HEADER);
  ASSERT_NE(lib, nullptr);
  auto launch = reinterpret_cast<void (*)(void**, unsigned, unsigned)>(dlsym(lib, "kiln_test_launch"));
  ASSERT_NE(launch, nullptr);
  auto launch_combine = reinterpret_cast<void (*)(void**, unsigned)>(dlsym(lib, "kiln_test_combine"));
  if (p->splits > 1) ASSERT_NE(launch_combine, nullptr);

  const int64_t nq = c.kv_heads * rows * c.dim, nk = c.kv_heads * c.keys * c.dim;
  auto random = [&](int64_t n) { return testing::random_elems(dt, n, rng, -2.0f, 2.0f); };
  std::vector<uint8_t> qb = random(nq), kb = random(nk), vb = random(nk);
  std::vector<uint8_t> ob(static_cast<size_t>(nq) * 4);
  const size_t es = 4;
  // The shim runs a 1-D grid: one launch per kv head (blockIdx.y), with the
  // bases the kernel would add for it.
  const int64_t per_head_partials = p->splits * rows * (c.dim + 2);
  std::vector<float> partials(static_cast<size_t>(c.kv_heads * per_head_partials));
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    uint8_t* out_h = ob.data() + h * p->out_strides[1] * es;
    float* partials_h = partials.data() + h * per_head_partials;
    void* ptr[] = {qb.data() + h * p->q_strides[1] * es, kb.data() + h * p->k_strides[1] * es,
                   vb.data() + h * p->v_strides[1] * es, p->splits > 1 ? static_cast<void*>(partials_h) : out_h};
    void* args[] = {&ptr[0], &ptr[1], &ptr[2], &ptr[3]};
    launch(args, gen.grid[0], gen.block);
    if (p->splits > 1) {
      void* cptr[] = {partials_h, out_h};
      void* cargs[] = {&cptr[0], &cptr[1]};
      launch_combine(cargs, combine.block);
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
  for (int64_t h = 0; h < c.kv_heads; ++h)
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> score(static_cast<size_t>(c.keys));
      double m = -INFINITY, l = 0;
      for (int64_t j = 0; j < c.keys; ++j) {
        double x = 0;
        for (int64_t e = 0; e < c.dim; ++e)
          x += read_elem(dt, qb, static_cast<size_t>((h * rows + r) * c.dim + e)) *
               read_elem(dt, kb, static_cast<size_t>((h * c.keys + j) * c.dim + e));
        score[static_cast<size_t>(j)] = x * scale;
        m = std::max(m, x * scale);
      }
      for (double& x : score) l += (x = std::exp(x - m));
      // Row r of kv head h is q head h * group + r / tokens at token r % tokens.
      const int64_t head = h * c.group + r / c.tokens, token = r % c.tokens;
      for (int64_t e = 0; e < c.dim; ++e) {
        double o = 0;
        for (int64_t j = 0; j < c.keys; ++j)
          o += score[static_cast<size_t>(j)] * read_elem(dt, vb, static_cast<size_t>((h * c.keys + j) * c.dim + e));
        const double want = round_to(dt, o / l);
        const double got = read_elem(dt, ob, static_cast<size_t>((token * heads + head) * c.dim + e));
        ASSERT_NEAR(got, want, 1e-5 * (1.0 + std::fabs(want))) << "head " << head << " token " << token << " dim " << e;
      }
    }
}

TEST(AttentionOutput, GroupedQueryRowsAreWrittenAtTheirHeads) {
  std::mt19937 rng(std::random_device{}());
  check_grouped_rows_output({2, 3, 8, 40, 16}, rng);  // prefill-shaped: the row-tiled kernel
  check_grouped_rows_output({2, 3, 2, 160, 32}, rng);  // few rows, many keys: the decode kernel
}

// Attention over learned keys: export folds K^T into a [.., dim, keys]
// constant, which the compiler stores [.., keys, dim] for the kernels (they
// read a key's head dim contiguously); before, the product was left to the CPU.
TEST(AttentionOutput, ConstantTransposedKeyIsStoredAsKeyRows) {
  std::mt19937 rng(std::random_device{}());
  const DType dt = DType::kFloat32;
  const int64_t heads = 2, rows = 2, keys = 160, dim = 32;
  ir::Graph g;
  const int q = g.add_input("q", dt, {1, heads, rows, dim});
  const std::vector<uint8_t> kt_bytes = testing::random_elems(dt, heads * dim * keys, rng, -1.0f, 1.0f);
  const int kt = g.add_constant("kt", dt, {1, heads, dim, keys}, kt_bytes);
  const int v = g.add_constant("v", dt, {1, heads, keys, dim}, testing::random_elems(dt, heads * keys * dim, rng, -1.0f, 1.0f));
  const int att = out0(g, g.add_node(ops::kKilnAttentionOp, "attention", {q, kt, v}, {{"k_transposed", int64_t{1}}},
                                     {{dt, {1, heads, rows, dim}}}));
  g.set_outputs({att});
  passes::attention_operand_layouts(g);
  passes::ExecPlan plan = passes::fuse(g);
  const auto* p = plan.ops.at(0).as<ops::AttentionPlan>();
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(plan.ops.size(), p->splits > 1 ? 2u : 1u);  // the split-keys merge, when decode-shaped
  EXPECT_EQ(p->keys, keys);
  EXPECT_EQ(p->k_strides[2], dim) << "key rows of the head dim, contiguous";
  const ir::Value& k = g.value(p->k);
  ASSERT_TRUE(k.is_constant);
  ASSERT_EQ(k.shape, (Shape{1, heads, keys, dim}));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < keys; ++j)
      for (int64_t d = 0; d < dim; ++d)
        ASSERT_EQ(read_elem(dt, k.data, static_cast<size_t>((h * keys + j) * dim + d)),
                  read_elem(dt, kt_bytes, static_cast<size_t>((h * dim + d) * keys + j)))
            << "head " << h << " key " << j << " dim " << d;
}

}  // namespace
}  // namespace kiln
