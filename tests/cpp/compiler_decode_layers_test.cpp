// The persistent decode-layers kernel (ops/decode_layers_kernel.h) on the CPU side: its source
// compiles with the real NVRTC and nvJitLink for sm_90 in bf16 and fp16 without spilling registers
// (ptxas's report, every code-changing option; the static_assert on its
// shared-memory state included), the shapes and grids it cannot take are refused with the reason,
// and its packed copy holds exactly the layers' weights, laid out as the kernel reads them (the
// load-time copies against the layout written out element by element). Its numerics are checked on the GPU by
// benchmarks/micro/decode_layers_persistent.cu (docs/gpu_results.md).
#include <gtest/gtest.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "codegen/nvrtc_compiler.h"
#include "ops/decode_layers_kernel.h"
#include "ops/decode_layers_ops.h"

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

TEST(DecodeLayersKernel, CompilesForSm90InBf16AndFp16WithOrWithoutTheHeadAndEmbedding) {
  for (engine::DType dtype : {engine::DType::kBFloat16, engine::DType::kFloat16})
    for (int64_t folded : {0, 1, 2}) {  // the layers; and the head; and the embedding
      const int64_t vocab = folded > 0 ? 512 : 0, embed_rows = folded > 1 ? 512 : 0;
      DecodeLayersShape s = bench_shape();
      s.dtype = dtype;
      s.layers = 3;  // the cache parameters are per layer
      s.vocab = vocab;
      s.embed_rows = embed_rows;
      const std::string name = "kiln_decode_layers_t" + std::to_string(static_cast<int>(dtype)) + "_" +
                               std::to_string(folded);
      const std::string src = decode_layers_kernel_source(s, DecodeLayersKernelOptions{}, name);
      EXPECT_NE(src.find("k_cache_2"), std::string::npos);
      EXPECT_EQ(src.find("k_cache_3"), std::string::npos);
      EXPECT_EQ(src.find("@"), std::string::npos) << "a token was left unreplaced";
      // The head's parameters and output type only with a head.
      EXPECT_EQ(src.find("const unsigned short* __restrict__ head_norm") != std::string::npos, vocab > 0);
      EXPECT_EQ(src.find("(long long* out") != std::string::npos, vocab > 0);
      EXPECT_EQ(src.find(", const long long* token_in") != std::string::npos, embed_rows > 0);
      EXPECT_EQ(decode_layers_sync_bytes(s, DecodeLayersKernelOptions{}), 16 + 16 * s.hidden + (vocab > 0 ? 16 : 0));
      const engine::KernelModule m = codegen::compile_module("dl", src, {90}, false);
      ASSERT_EQ(m.cubins.size(), 1u);
      EXPECT_TRUE(contains(m.cubins[0].image, name));
    }
}

TEST(DecodeLayersKernel, BothAttentionStageSizesCompile) {
  // The default's other kv_rows (64: keys and values share a ring slot; 128: a slot each).
  for (int rows : {64, 128, 0}) {  // 0: by position, both stage bodies compiled
    DecodeLayersKernelOptions o;
    o.kv_rows = rows;
    DecodeLayersShape s = bench_shape();
    s.layers = 2;
    const std::string name = "kiln_decode_layers_kv" + std::to_string(rows);
    const std::string src = decode_layers_kernel_source(s, o, name);
    EXPECT_NE(src.find("kKvRows = " + std::to_string(rows)), std::string::npos);
    const engine::KernelModule m = codegen::compile_module("dl", src, {90}, false);
    ASSERT_EQ(m.cubins.size(), 1u);
    EXPECT_TRUE(contains(m.cubins[0].image, name));
  }
}

TEST(DecodeLayersKernel, CountedRowsCompileAndGrowTheSyncArea) {
  // Counted rows (the readers poll the rows, no arrival a phase), without and with the head.
  for (int counted : {1, 2}) {
    DecodeLayersKernelOptions o;
    o.counted_rows = counted;
    DecodeLayersShape s = bench_shape();
    s.layers = 2;
    s.vocab = counted == 2 ? 512 : 0;
    const std::string name = "kiln_decode_layers_counted" + std::to_string(counted);
    const std::string src = decode_layers_kernel_source(s, o, name);
    EXPECT_NE(src.find("kCounted = " + std::to_string(counted)), std::string::npos);
    // the fp32 area, the head's key and the overflow flag, then two sets of 2 * layers u64 rows
    EXPECT_EQ(decode_layers_sync_bytes(s, o), 16 + 16 * s.hidden + 32 + 2 * 4 * s.hidden * 8);
    EXPECT_EQ(decode_layers_grid_unfit(s, o, 128), "");
    const engine::KernelModule m = codegen::compile_module("dl", src, {90}, false);
    ASSERT_EQ(m.cubins.size(), 1u);
    EXPECT_TRUE(contains(m.cubins[0].image, name));
  }
  DecodeLayersKernelOptions bad;
  bad.counted_rows = 3;
  EXPECT_NE(decode_layers_grid_unfit(bench_shape(), bad, 128).find("counted_rows 3"), std::string::npos);
}

TEST(DecodeLayersKernel, OptionsAreSetByNameAndChecked) {
  DecodeLayersKernelOptions o;
  EXPECT_EQ(set_decode_layers_option(o, "counted_rows", 2), "");
  EXPECT_EQ(set_decode_layers_option(o, "kv_rows", 0), "");
  EXPECT_EQ(o.counted_rows, 2);
  EXPECT_EQ(o.kv_rows, 0);
  EXPECT_EQ(decode_layers_options_text(o),
            "stages=13,a_tasks=8,max_inflight=2,release_inflight=1,head_inflight=2,kv_rows=0,counted_rows=2,"
            "l2_prefetch=0,warp_rotary=0,warp_norm=0,b_inflight=0");
  EXPECT_EQ(decode_layers_options_invalid(o), "");
  // trace and compute are the micro-benchmark's: not settable by name
  EXPECT_NE(set_decode_layers_option(o, "trace", 1).find("unknown persistent_decode option 'trace' (the options: stages, a_tasks"),
            std::string::npos);
  EXPECT_EQ(set_decode_layers_option(o, "stages", 3), "");
  EXPECT_EQ(decode_layers_options_invalid(o), "stages 3 (the ring's 16 KB stages: 4 to 13)");
  o.stages = 13;
  o.release_inflight = -2;
  EXPECT_NE(decode_layers_options_invalid(o).find("release_inflight -2"), std::string::npos);
  o.release_inflight = 1;
  EXPECT_EQ(set_decode_layers_option(o, "l2_prefetch", 65), "");
  EXPECT_NE(decode_layers_options_invalid(o).find("l2_prefetch 65 (stages prefetched into L2"), std::string::npos);
}

TEST(DecodeLayersKernel, L2PrefetchWarpRotaryAndWarpNormCompile) {
  // The producer prefetches stages ahead into L2 (weights, cached rows, the head's rows); each
  // warp rotates its own q|k|v pair and normalizes its own share of the row.
  DecodeLayersKernelOptions o;
  o.l2_prefetch = 16;
  o.counted_rows = 1;
  o.warp_rotary = 1;
  o.warp_norm = 1;
  o.b_inflight = 1;
  DecodeLayersShape s = bench_shape();
  s.layers = 2;
  s.vocab = 512;
  const std::string src = decode_layers_kernel_source(s, o, "kiln_decode_layers_l2");
  EXPECT_NE(src.find("kL2Ahead = 16"), std::string::npos);
  EXPECT_NE(src.find("kWarpRotary = 1"), std::string::npos);
  EXPECT_NE(src.find("kWarpNorm = 1"), std::string::npos);
  EXPECT_NE(src.find("kBInflight = 1"), std::string::npos);
  EXPECT_NE(src.find("cp.async.bulk.prefetch.L2.global"), std::string::npos);
  const engine::KernelModule m = codegen::compile_module("dl", src, {90}, false);
  ASSERT_EQ(m.cubins.size(), 1u);
  EXPECT_TRUE(contains(m.cubins[0].image, "kiln_decode_layers_l2"));
}

// ptxas's report for `src` compiled for sm_90 (NVRTC with --ptxas-options=-v), as the engine's
// cubin is assembled from the same PTX.
std::string ptxas_report(const std::string& src) {
  nvrtcProgram prog;
  EXPECT_EQ(nvrtcCreateProgram(&prog, src.c_str(), "decode_layers.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  const char* opts[] = {"--gpu-architecture=sm_90", "--std=c++17", "-default-device", "--ptxas-options=-v"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  nvrtcGetProgramLog(prog, log.data());
  log.resize(std::strlen(log.c_str()));  // the size counts the terminating NUL
  nvrtcDestroyProgram(&prog);
  EXPECT_EQ(r, NVRTC_SUCCESS) << log;
  return log;
}

TEST(DecodeLayersKernel, NoVariantSpillsRegisters) {
  // The kernel keeps each lane's share of the normalized row (32 floats) and its partial sums in
  // registers under __launch_bounds__ (one 288-thread block an SM): a change that pushed them to
  // local memory would slow every product without failing any numerics check. The bench shape with
  // the head and the embedding folded in (the program llm_bench runs), with every option that
  // changes the code.
  struct Variant {
    const char* options;
    void (*set)(DecodeLayersKernelOptions&);
  };
  const Variant variants[] = {
      {"defaults", [](DecodeLayersKernelOptions&) {}},
      {"kv_rows 0", [](DecodeLayersKernelOptions& o) { o.kv_rows = 0; }},
      {"counted_rows 2", [](DecodeLayersKernelOptions& o) { o.counted_rows = 2; }},
      {"every item-17 option", [](DecodeLayersKernelOptions& o) {
         o.counted_rows = 1, o.kv_rows = 0, o.l2_prefetch = 16, o.warp_rotary = 1, o.warp_norm = 1, o.b_inflight = 1;
       }},
  };
  DecodeLayersShape s = bench_shape();
  s.vocab = 32000;
  s.embed_rows = 32000;
  const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)"), regs(R"(Used (\d+) registers)");
  for (const Variant& v : variants) {
    DecodeLayersKernelOptions o;
    v.set(o);
    const std::string log = ptxas_report(decode_layers_kernel_source(s, o, "kiln_decode_layers"));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, spills)) << v.options << ": no spill line in\n" << log;
    EXPECT_EQ(m[1].str(), "0") << v.options << " spills registers:\n" << log;
    EXPECT_EQ(m[2].str(), "0") << v.options << " spills registers:\n" << log;
    ASSERT_TRUE(std::regex_search(log, m, regs)) << v.options << ": no register line in\n" << log;
    EXPECT_LE(std::stoi(m[1].str()), 224) << v.options;  // 65536 / 288 threads, rounded to ptxas's 8
    EXPECT_EQ(log.find("warning"), std::string::npos) << v.options << ":\n" << log;
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
      {[](DecodeLayersShape& s) { s.vocab = 500; }, "a vocabulary of 500 (the head takes a multiple of 8)"},
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
  o.a_tasks = 8;
  o.kv_rows = 96;
  EXPECT_NE(decode_layers_grid_unfit(s, o, 120).find("kv_rows 96 (a stage of cached rows is 64 or 128 rows; 0: by position)"), std::string::npos);
  o.kv_rows = 64;
  o.head_inflight = -1;
  EXPECT_NE(decode_layers_grid_unfit(s, o, 120).find("head_inflight -1"), std::string::npos);
}

TEST(DecodeLayersKernel, PackedCopyHoldsExactlyTheLayersWeights) {
  const DecodeLayersShape s = bench_shape();
  const int64_t h = s.hidden, d = s.head_dim, inter = s.intermediate;
  const int64_t per_layer = h * s.heads * d + 2 * h * s.kv_heads * d + s.heads * d * h + 3 * h * inter;
  EXPECT_EQ(decode_layers_packed_elems(s), s.layers * (per_layer + 2 * h));  // and the two norms
  EXPECT_LE(decode_layers_shared_bytes(DecodeLayersKernelOptions{}), 227 * 1024);  // sm_90's opt-in limit
}


// The copies decode_layers_pack_copies gives, applied on the host to weights whose every element
// names itself, against the kernel's layout computed element by element (the micro-benchmark's
// pack() as plain C++): q|k|v rows of each phase-A block, o halves, gate|up tasks, down pairs, norms.
void check_packing(bool gate_first) {
  DecodeLayersShape s = bench_shape();
  s.layers = 1;
  DecodeLayersPlan plan;
  plan.shape = s;
  DecodeLayersPlan::Layer L;
  L.q_col = 0, L.k_col = 1024, L.v_col = 1536, L.gate_first = gate_first;
  plan.layers = {L};
  const int64_t H = 1024, I = 4096;
  // tensors 0..5: norm1, norm2, qkv [2048, H], o [H, H], gate_up [2I, H], down [H, I]
  const int64_t rows[6] = {1, 1, 2048, H, 2 * I, H}, cols[6] = {H, H, H, H, H, I};
  std::vector<std::vector<uint16_t>> w(6);
  for (int t = 0; t < 6; ++t) {
    w[t].resize(static_cast<size_t>(rows[t] * cols[t]));
    for (size_t i = 0; i < w[t].size(); ++i) w[t][i] = static_cast<uint16_t>((i * 2654435761u + 40503u * t) >> 7);
  }
  const std::vector<engine::DerivedCopy> copies = decode_layers_pack_copies(plan, {0, 1, 2, 3, 4, 5});
  std::vector<uint16_t> packed(static_cast<size_t>(decode_layers_packed_elems(s)), 0xdead);
  std::vector<uint8_t> written(packed.size(), 0);
  for (const engine::DerivedCopy& c : copies) {
    ASSERT_LT(c.source, 6u);
    ASSERT_EQ(c.offset % 16, 0u);
    ASSERT_EQ(c.row_bytes % 16, 0u);
    for (uint32_t r = 0; r < c.rows; ++r) {
      const uint64_t src = c.offset + r * c.stride, dst = c.dst + uint64_t{r} * c.row_bytes;
      ASSERT_LE(src + c.row_bytes, w[c.source].size() * 2);
      ASSERT_LE(dst + c.row_bytes, packed.size() * 2);
      std::memcpy(reinterpret_cast<uint8_t*>(packed.data()) + dst, reinterpret_cast<const uint8_t*>(w[c.source].data()) + src,
                  c.row_bytes);
      for (uint64_t e = dst / 2; e < (dst + c.row_bytes) / 2; ++e) ++written[e];
    }
  }
  EXPECT_TRUE(std::all_of(written.begin(), written.end(), [](uint8_t n) { return n == 1; }))
      << "every packed element written exactly once";
  const int64_t a_region = 64 * 6, gu_region = a_region + I / 4, stages = gu_region + I / 8, elems = 8192;
  auto head_dim_of = [](int64_t r, int64_t row) { return row < 4 ? 4 * r + row : 4 * r + 28 + row; };
  int64_t bad = 0;
  for (int64_t k = 0; k < stages; ++k)
    for (int64_t e = 0; e < elems; ++e) {
      uint16_t want;
      if (k < a_region) {
        const int64_t b = k / 6, kind = k % 6, r = b % 8, g = b / 8;
        if (kind < 4) {
          const int64_t row = e / H, col = e % H, d = head_dim_of(r, row);
          const int64_t src = kind < 2 ? (2 * g + kind) * 64 + d : (kind == 2 ? 1024 : 1536) + g * 64 + d;
          want = w[2][static_cast<size_t>(src * H + col)];
        } else {
          const int64_t row = 128 * r + 64 * (kind - 4) + e / 128, col = 2 * g * 64 + e % 128;
          want = w[3][static_cast<size_t>(row * H + col)];
        }
      } else if (k < gu_region) {
        const int64_t row = e / H, col = e % H, n = 4 * (k - a_region) + (row & 3);
        const bool gate = row < 4;
        const int64_t base = gate == gate_first ? 0 : I;
        want = w[4][static_cast<size_t>((base + n) * H + col)];
      } else {
        const int64_t row = e / 8, col = 8 * (k - gu_region) + e % 8;
        want = w[5][static_cast<size_t>(row * I + col)];
      }
      bad += packed[static_cast<size_t>(k * elems + e)] != want;
    }
  for (int64_t which = 0; which < 2; ++which)
    for (int64_t j = 0; j < H; ++j) bad += packed[static_cast<size_t>(stages * elems + which * H + j)] != w[which][j];
  EXPECT_EQ(bad, 0);
}

TEST(DecodeLayersKernel, LoadTimeCopiesLayTheWeightsOutAsTheKernelReadsThem) {
  check_packing(true);
  check_packing(false);  // up before gate in the merged weight
}

}  // namespace
}  // namespace kiln::ops
