// The persistent decode-layers kernel (ops/decode_layers_kernel.h) on the CPU side: its source
// compiles with the real NVRTC and nvJitLink for sm_90 in bf16 and fp16 (the static_assert on its
// shared-memory state included), the shapes and grids it cannot take are refused with the reason,
// and its packed copy holds exactly the layers' weights. Its numerics are checked on the GPU by
// benchmarks/micro/decode_layers_persistent.cu (docs/gpu_results.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "codegen/nvrtc_compiler.h"
#include "ops/decode_layers_kernel.h"

namespace kiln::ops {
namespace {

// The 410M benchmark model's decode layers (examples/llm_generate/llama_kv.py "bench").
DecodeLayersShape bench_shape() {
  DecodeLayersShape s;
  s.hidden = 1024, s.intermediate = 4096, s.layers = 24, s.heads = 16, s.kv_heads = 8, s.head_dim = 64;
  s.max_len = 2048, s.eps = 1e-5, s.dtype = engine::DType::kBFloat16;
  return s;
}

bool contains(const std::vector<uint8_t>& image, const std::string& text) {
  return std::search(image.begin(), image.end(), text.begin(), text.end()) != image.end();
}

TEST(DecodeLayersKernel, CompilesForSm90InBf16AndFp16) {
  for (engine::DType dtype : {engine::DType::kBFloat16, engine::DType::kFloat16}) {
    DecodeLayersShape s = bench_shape();
    s.dtype = dtype;
    s.layers = 3;  // the cache parameters are per layer
    const std::string name = "kiln_decode_layers_t" + std::to_string(static_cast<int>(dtype));
    const std::string src = decode_layers_kernel_source(s, DecodeLayersKernelOptions{}, name);
    EXPECT_NE(src.find("k_cache_2"), std::string::npos);
    EXPECT_EQ(src.find("k_cache_3"), std::string::npos);
    EXPECT_EQ(src.find("@"), std::string::npos) << "a token was left unreplaced";
    const engine::KernelModule m = codegen::compile_module("dl", src, {90}, false);
    ASSERT_EQ(m.cubins.size(), 1u);
    EXPECT_TRUE(contains(m.cubins[0].image, name));
  }
}

TEST(DecodeLayersKernel, TraceAddsItsParameter) {
  DecodeLayersKernelOptions o;
  o.trace = true;
  const std::string traced = decode_layers_kernel_source(bench_shape(), o, "k");
  EXPECT_NE(traced.find("unsigned long long* trace"), std::string::npos);
  EXPECT_EQ(decode_layers_kernel_source(bench_shape(), {}, "k").find("unsigned long long* trace"), std::string::npos);
}

TEST(DecodeLayersKernel, RefusesShapesItWasNotBuiltFor) {
  EXPECT_EQ(decode_layers_unsupported(bench_shape()), "");
  struct Case {
    void (*edit)(DecodeLayersShape&);
    const char* says;
  };
  const Case cases[] = {
      {[](DecodeLayersShape& s) { s.hidden = 2048; }, "hidden size 2048"},
      {[](DecodeLayersShape& s) { s.head_dim = 128; }, "head_dim 128"},
      {[](DecodeLayersShape& s) { s.heads = 24; }, "24 query heads for 8 kv heads"},
      {[](DecodeLayersShape& s) { s.intermediate = 4100; }, "intermediate size 4100"},
      {[](DecodeLayersShape& s) { s.dtype = engine::DType::kFloat32; }, "bf16 or fp16"},
      {[](DecodeLayersShape& s) { s.layers = 0; }, "0 layers"},
  };
  for (const Case& c : cases) {
    DecodeLayersShape s = bench_shape();
    c.edit(s);
    EXPECT_NE(decode_layers_unsupported(s).find(c.says), std::string::npos) << decode_layers_unsupported(s);
  }
}

TEST(DecodeLayersKernel, GridsThatCannotSplitTheWorkAreRefused) {
  const DecodeLayersShape s = bench_shape();
  DecodeLayersKernelOptions o;
  EXPECT_EQ(decode_layers_grid_unfit(s, o, 120), "");  // 15 clusters: an H100's 132 SMs
  EXPECT_EQ(decode_layers_grid_unfit(s, o, 128), "");  // 16
  EXPECT_NE(decode_layers_grid_unfit(s, o, 56).find("at least 64"), std::string::npos);
  EXPECT_NE(decode_layers_grid_unfit(s, o, 100).find("whole clusters"), std::string::npos);
  // 72 blocks: the 8 without phase-A work would need 64 MLP tasks each, more than the 16 they can hold.
  EXPECT_NE(decode_layers_grid_unfit(s, o, 72).find("cannot share"), std::string::npos);
  EXPECT_NE(decode_layers_grid_unfit(s, o, 64).find("cannot share"), std::string::npos);  // nobody takes the rest
  o.a_tasks = 16;  // the phase-A blocks take every task
  EXPECT_EQ(decode_layers_grid_unfit(s, o, 64), "");
  o.a_tasks = 7;
  EXPECT_NE(decode_layers_grid_unfit(s, o, 120).find("an even number"), std::string::npos);
}

TEST(DecodeLayersKernel, PackedCopyHoldsExactlyTheLayersWeights) {
  const DecodeLayersShape s = bench_shape();
  const int64_t h = s.hidden, d = s.head_dim, inter = s.intermediate;
  const int64_t per_layer = h * s.heads * d + 2 * h * s.kv_heads * d + s.heads * d * h + 3 * h * inter;
  EXPECT_EQ(decode_layers_packed_elems(s), s.layers * (per_layer + 2 * h));  // and the two norms
  EXPECT_LE(decode_layers_shared_bytes(DecodeLayersKernelOptions{}), 227 * 1024);  // sm_90's opt-in limit
}

}  // namespace
}  // namespace kiln::ops
