// The decode-shaped attention (ops/attention_decode_kernel.cpp), no GPU
// needed: the split-keys kernel and its combine against a reference computed
// here on fresh random inputs (each kernel compiled as host C++ through
// cuda_block_shim.h), and, with programmatic launch, the cache rows'
// L2 prefetch placed above the kernel's wait in the sm_90 code.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "codegen/grid_dependency.h"
#include "codegen/nvrtc_compiler.h"
#include "compiler_test_util.h"
#include "host_kernel.h"
#include "ops/attention_kernel.h"
#include "ops/elementwise_kernel.h"

#ifndef KILN_BLOCK_SHIM_HEADER
#error "KILN_BLOCK_SHIM_HEADER must be defined by the build"
#endif

namespace kiln {
namespace {

using engine::DType;
using testing::read_elem;
using testing::round_to;
using testing::count_of;

std::vector<uint8_t> random_bytes(DType d, int64_t count, std::mt19937& rng) {
  return testing::random_elems(d, count, rng, -3.0f, 3.0f);
}

// A decode plan: `heads` heads of `rows` query rows over `keys` cached keys.
ops::AttentionPlan decode_plan(DType dt, int64_t heads, int64_t rows, int64_t keys, int64_t dim) {
  ops::AttentionPlan p;
  p.dtype = dt;
  p.heads = p.kv_heads = heads;
  p.rows = rows;
  p.keys = keys;
  p.head_dim = p.value_dim = dim;
  p.q_strides = {heads * rows * dim, rows * dim, dim};
  p.out_strides = p.q_strides;
  p.k_strides = {heads * keys * dim, keys * dim, dim};
  p.v_strides = p.k_strides;
  p.mask_kind = ops::AttentionPlan::Mask::kBool;
  p.dtype_mask = DType::kBool;
  p.mask_strides = {0, 0, keys, 1};  // [rows, keys], broadcast over batch and heads
  p.scale = 1.0 / std::sqrt(static_cast<double>(dim));
  return p;
}

// With programmatic launch the decode attention prefetches its blocks' cache
// rows into L2 before it waits for the kernel that writes the current row: in
// the sm_90 code the prefetches, then the wait, and the first load (the
// query, which that kernel writes) after the wait; the trigger comes after
// the wait too (after the keys), so its successor launches late.
TEST(DecodeAttention, CachePrefetchComesBeforeTheWait) {
  for (bool prefetch : {true, false}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch");
    ops::AttentionPlan p = decode_plan(DType::kBFloat16, 4, 1, 768, 64);
    p.splits = 8;
    p.prefetch_before_wait = prefetch;
    const ops::AttentionKernel gen = ops::generate_attention_kernel(p, "kiln_attention_prefetch");
    EXPECT_EQ(count_of(gen.source, codegen::kGridDependencyWaitMarker), prefetch ? 1u : 0u);
    const engine::KernelModule module = codegen::compile_module("m", ops::pointwise_prelude() + gen.source, {90}, true, {}, true);
    const std::string patched = codegen::add_grid_dependency(module.ptx);
    const size_t trigger = patched.find("griddepcontrol.launch_dependents;");
    const size_t wait = patched.find("griddepcontrol.wait;");
    const size_t prefetched = patched.find("prefetch.global.L2");
    const size_t load = patched.find("ld.global");
    ASSERT_NE(wait, std::string::npos);
    ASSERT_NE(load, std::string::npos);
    EXPECT_LT(wait, load) << "nothing a kernel writes is loaded before the wait";
    if (!prefetch) {
      EXPECT_EQ(prefetched, std::string::npos);
      continue;
    }
    ASSERT_NE(prefetched, std::string::npos);
    EXPECT_LT(prefetched, wait);
    EXPECT_LT(wait, trigger);
    EXPECT_EQ(count_of(patched, "griddepcontrol.launch_dependents;"), 1u);
  }
}

// A few query rows per head over many keys (a new token over a KV cache,
// grouped-query heads stacked as rows), with a boolean position mask, against
// softmax(q k^T * scale + mask) v in double; the one-block-a-head kernel and
// the split-keys pair (flash-decoding: partial states, then a combine).
TEST(DecodeAttention, MatchesReference) {
  std::mt19937 rng(std::random_device{}());
  struct Case {
    DType dt;
    int64_t heads, rows, keys, dim;
    int64_t visible;  // keys [0, visible) unmasked for row 0; row r sees one fewer per row
    int64_t splits;   // the split variant's blocks a head (the last split may hold only masked keys)
  };
  for (const Case& c : {Case{DType::kFloat32, 2, 2, 300, 64, 170, 4}, Case{DType::kBFloat16, 3, 1, 768, 64, 513, 12},
                        Case{DType::kFloat16, 1, 4, 160, 128, 160, 2},
                        // 48 dims do not split evenly over the lanes: values read a dim a lane.
                        Case{DType::kFloat32, 1, 3, 200, 48, 150, 3}}) {
    SCOPED_TRACE(std::string(engine::dtype_name(c.dt)) + " rows " + std::to_string(c.rows));
    ops::AttentionPlan p = decode_plan(c.dt, c.heads, c.rows, c.keys, c.dim);
    ASSERT_TRUE(ops::attention_is_decode(p));
    ops::AttentionKernel gen = ops::generate_attention_kernel(p, "kiln_decode_attention_test");
    // The module's inline-PTX helpers are for the GPU; the decode kernel uses none.
    std::string src = gen.source.substr(gen.source.find("// kiln_decode_attention_test"));
    src = "#define KILN_NEG_INF (-INFINITY)\n" + src;
    const std::string wrapped = testing::host_prelude() + src +
                                "\nextern \"C\" void kiln_test_launch(void** args, unsigned block) {\n"
                                "  kiln_shim_launch_blocks(&kiln_decode_attention_test, args, 1, block,\n"
                                "      kiln_shim::Order::kLowWarpFirst);\n}\n";
    void* lib = testing::build_host_module(wrapped, "decode_attention_" + std::string(engine::dtype_name(c.dt)),
                                           KILN_BLOCK_SHIM_HEADER);
    ASSERT_NE(lib, nullptr);
    auto launch = reinterpret_cast<void (*)(void**, unsigned)>(dlsym(lib, "kiln_test_launch"));
    ASSERT_NE(launch, nullptr);
    const int64_t nq = c.heads * c.rows * c.dim, nk = c.heads * c.keys * c.dim;
    std::vector<uint8_t> q = random_bytes(c.dt, nq, rng), k = random_bytes(c.dt, nk, rng),
                         v = random_bytes(c.dt, nk, rng), out(static_cast<size_t>(nq) * engine::dtype_size(c.dt));
    std::vector<uint8_t> mask(static_cast<size_t>(c.rows * c.keys));
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t j = 0; j < c.keys; ++j) mask[static_cast<size_t>(r * c.keys + j)] = j < c.visible - r;
    // The keys split over blocks (flash-decoding) and merged by the combine
    // kernel: the same output.
    ops::AttentionPlan split = p;
    split.splits = c.splits;
    split.prefetch_before_wait = true;  // its wait marker and prefetch loop (compiled out on the host)
    ops::AttentionKernel split_gen = ops::generate_attention_kernel(split, "kiln_split_attention_test");
    ops::AttentionKernel combine_gen = ops::generate_attention_combine_kernel(split, "kiln_attention_combine_test");
    EXPECT_EQ(split_gen.grid[0], static_cast<uint32_t>(c.splits));
    EXPECT_EQ(count_of(split_gen.source, codegen::kGridDependencyWaitMarker), 1u);
    EXPECT_EQ(count_of(gen.source, codegen::kGridDependencyWaitMarker), 0u);
    std::string split_src = "#define KILN_NEG_INF (-INFINITY)\n" +
                            split_gen.source.substr(split_gen.source.find("// kiln_split_attention_test"));
    const std::string split_wrapped =
        testing::host_prelude() + split_src + combine_gen.source +
        "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block) {\n"
        "  kiln_shim_launch_blocks(&kiln_split_attention_test, args, grid, block, kiln_shim::Order::kHighWarpFirst);\n}\n"
        "extern \"C\" void kiln_test_combine(void** args, unsigned block) {\n"
        "  kiln_shim_launch_blocks(&kiln_attention_combine_test, args, 1, block);\n}\n";
    void* split_lib = testing::build_host_module(split_wrapped, "split_attention", KILN_BLOCK_SHIM_HEADER);
    ASSERT_NE(split_lib, nullptr);
    auto split_launch = reinterpret_cast<void (*)(void**, unsigned, unsigned)>(dlsym(split_lib, "kiln_test_launch"));
    auto combine_launch = reinterpret_cast<void (*)(void**, unsigned)>(dlsym(split_lib, "kiln_test_combine"));
    ASSERT_NE(split_launch, nullptr);
    ASSERT_NE(combine_launch, nullptr);
    std::vector<float> partials(static_cast<size_t>(c.splits * c.rows * (c.dim + 2)));
    std::vector<uint8_t> split_out(out.size());
    // One launch per head (blockIdx.y), as the grid would.
    for (int64_t h = 0; h < c.heads; ++h) {
      void* ptr[] = {q.data() + h * c.rows * c.dim * engine::dtype_size(c.dt),
                     k.data() + h * c.keys * c.dim * engine::dtype_size(c.dt),
                     v.data() + h * c.keys * c.dim * engine::dtype_size(c.dt), mask.data(),
                     out.data() + h * c.rows * c.dim * engine::dtype_size(c.dt)};
      void* args[] = {&ptr[0], &ptr[1], &ptr[2], &ptr[3], &ptr[4]};
      launch(args, gen.block);
      void* pp = partials.data();
      ptr[4] = pp;
      split_launch(args, split_gen.grid[0], split_gen.block);
      void* combine_ptr[] = {pp, split_out.data() + h * c.rows * c.dim * engine::dtype_size(c.dt)};
      void* combine_args[] = {&combine_ptr[0], &combine_ptr[1]};
      combine_launch(combine_args, combine_gen.block);
    }
    const double tol = c.dt == DType::kFloat32 ? 1e-5 : c.dt == DType::kFloat16 ? 2e-3 : 1.6e-2;
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t r = 0; r < c.rows; ++r) {
        std::vector<double> score(static_cast<size_t>(c.keys));
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < c.keys; ++j) {
          double x = 0;
          for (int64_t e = 0; e < c.dim; ++e)
            x += read_elem(c.dt, q, static_cast<size_t>((h * c.rows + r) * c.dim + e)) *
                 read_elem(c.dt, k, static_cast<size_t>((h * c.keys + j) * c.dim + e));
          score[static_cast<size_t>(j)] = mask[static_cast<size_t>(r * c.keys + j)] ? x * p.scale : -INFINITY;
          m = std::max(m, score[static_cast<size_t>(j)]);
        }
        for (double& x : score) l += (x = std::exp(x - m));
        for (int64_t e = 0; e < c.dim; ++e) {
          double o = 0;
          for (int64_t j = 0; j < c.keys; ++j)
            o += score[static_cast<size_t>(j)] * read_elem(c.dt, v, static_cast<size_t>((h * c.keys + j) * c.dim + e));
          const double want = round_to(c.dt, o / l);
          const double got = read_elem(c.dt, out, static_cast<size_t>((h * c.rows + r) * c.dim + e));
          ASSERT_NEAR(got, want, tol * (1.0 + std::fabs(want))) << "head " << h << " row " << r << " dim " << e;
          const double got_split = read_elem(c.dt, split_out, static_cast<size_t>((h * c.rows + r) * c.dim + e));
          ASSERT_NEAR(got_split, want, tol * (1.0 + std::fabs(want)))
              << c.splits << " splits: head " << h << " row " << r << " dim " << e;
        }
      }
  }
}

}  // namespace
}  // namespace kiln
