// Conv runtime pieces. Without a GPU: the algorithm cache's key and file
// format. With a GPU (skipped, saying so, when there is none): conv and
// batched-GEMM engines against a CPU reference on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "runtime/conv_algo_cache.h"
#include "runtime/device.h"
#include "runtime/engine.h"
#include "runtime/execution_context.h"
#include "runtime/steps/conv_step_exec.h"

namespace kiln::runtime {
namespace {

using engine::ConvStep;
using engine::DType;

ConvStep sample_conv() {
  ConvStep c;
  c.x = 0, c.w = 1, c.bias = 2, c.z = 3, c.out = 4;
  c.n = 2, c.h = 8, c.w_in = 8, c.c = 4, c.k = 6, c.r = 3, c.s = 3, c.p = 4, c.q = 4;
  c.pad_h = c.pad_w = 1;
  c.stride_h = c.stride_w = 2;
  c.groups = 2;
  c.activation = engine::ConvActivation::kRelu;
  return c;
}

std::string key_of(const ConvStep& c, DType dtype = DType::kFloat16, int sm = 90,
                   uint32_t align_x = 256) {
  return conv_cache_key(make_conv_signature(c, dtype, false, sm, 91900, align_x, 256, 256, 256,
                                            256));
}

TEST(ConvAlgoCache, KeyNamesEveryField) {
  const ConvStep base = sample_conv();
  EXPECT_EQ(key_of(base),
            "conv1/sm90/cudnn91900/float16/x2x8x8x4/k6r3s3/o4x4/pad1x1/str2x2/dil1x1/g2/relu/"
            "bias/z+/al256.256.256.256.256");
  std::set<std::string> keys = {key_of(base)};
  // Every field that can change the algorithm must change the key.
  std::vector<ConvStep> variants;
  for (int field = 0; field < 18; ++field) {
    ConvStep c = base;
    int64_t* fields[] = {&c.n,     &c.h,        &c.w_in,     &c.c,     &c.k,     &c.r,
                         &c.s,     &c.p,        &c.q,        &c.pad_h, &c.pad_w, &c.stride_h,
                         &c.stride_w, &c.dilation_h, &c.dilation_w, &c.groups};
    if (field < 16) {
      *fields[field] += 1;
    } else if (field == 16) {
      c.bias = engine::kNoTensor;
    } else {
      c.activation = engine::ConvActivation::kNone;
    }
    EXPECT_TRUE(keys.insert(key_of(c)).second) << "field " << field << ": " << key_of(c);
  }
  ConvStep no_z = base;
  no_z.z = engine::kNoTensor;
  EXPECT_TRUE(keys.insert(key_of(no_z)).second);
  EXPECT_TRUE(keys.insert(key_of(base, DType::kFloat32)).second);
  EXPECT_TRUE(keys.insert(key_of(base, DType::kFloat16, 87)).second);
  EXPECT_TRUE(keys.insert(key_of(base, DType::kFloat16, 90, 16)).second);
  const std::string in_place = conv_cache_key(
      make_conv_signature(base, DType::kFloat16, true, 90, 91900, 256, 256, 256, 256, 256));
  EXPECT_TRUE(keys.insert(in_place).second);
  for (const std::string& k : keys) EXPECT_EQ(k.find(' '), std::string::npos) << k;
}

TEST(ConvAlgoCache, LineFormatRoundTripsAndRejectsGarbage) {
  ConvAlgoChoice c;
  c.algo = 1;
  c.fused = true;
  c.math_type = 1;
  c.time_ms = 0.125f;
  const std::string line = format_cache_line("conv1/x", c);
  std::string key;
  ConvAlgoChoice back;
  ASSERT_TRUE(parse_cache_line(line, &key, &back)) << line;
  EXPECT_EQ(key, "conv1/x");
  EXPECT_EQ(back.algo, 1);
  EXPECT_TRUE(back.fused);
  EXPECT_EQ(back.math_type, 1);
  EXPECT_FLOAT_EQ(back.time_ms, 0.125f);
  for (const char* bad : {"", "# comment", "key", "key 1 1", "key x 1 1 0.5", "key 1 2 1 0.5",
                          "key -1 0 1 0.5", "key 1 0 1 0.5 extra", " 1 0 1 0.5",
                          "key 99999999999999999999 0 1 0.5"})
    EXPECT_FALSE(parse_cache_line(bad, &key, &back)) << "'" << bad << "'";
}

TEST(ConvAlgoCache, PersistsAcrossInstancesAndLaterLinesWin) {
  char path[] = "/tmp/kiln_algo_cache_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::remove(path);  // the cache creates it, with a header
  {
    ConvAlgoCache cache(path);
    ConvAlgoChoice c;
    EXPECT_FALSE(cache.lookup("a", &c));
    c.algo = 2;
    cache.insert("a", c);
    c.algo = 5;
    cache.insert("a", c);
    c.algo = 0;
    cache.insert("b", c);
    EXPECT_EQ(cache.size(), 2u);
  }
  std::FILE* f = std::fopen(path, "a");
  ASSERT_NE(f, nullptr);
  std::fputs("garbage line\n", f);
  std::fclose(f);
  ConvAlgoCache reread(path);
  ConvAlgoChoice c;
  ASSERT_TRUE(reread.lookup("a", &c));
  EXPECT_EQ(c.algo, 5);
  EXPECT_EQ(reread.size(), 2u);
  reread.erase("a");
  EXPECT_FALSE(reread.lookup("a", &c));
  std::remove(path);

  ConvAlgoCache memory_only("");
  memory_only.insert("k", c);
  EXPECT_TRUE(memory_only.lookup("k", &c));
}

// ---- GPU ------------------------------------------------------------------

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    Status gpu = check_gpu_available();                                             \
    if (!gpu.is_ok()) GTEST_SKIP() << "needs a CUDA GPU: " << gpu.message();        \
  } while (0)

void add_tensor(engine::EngineDesc& d, const char* name, std::vector<int64_t> shape,
                engine::StorageKind storage, uint32_t io, uint64_t offset) {
  engine::TensorDesc t;
  t.name = name;
  t.dtype = DType::kFloat32;
  t.shape = std::move(shape);
  t.storage = storage;
  t.io_index = io;
  t.offset = offset;
  t.nbytes = 4;
  for (int64_t s : t.shape) t.nbytes *= static_cast<uint64_t>(s);
  d.tensors.push_back(t);
}

std::vector<float> random_floats(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += want[i] * double(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// fp32 conv with bias + z + ReLU, groups 2, stride 2, against a CPU loop.
TEST(RuntimeConvGpu, Float32ConvBiasResidualReluMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1234);
  const ConvStep c = sample_conv();
  engine::EngineDesc d;
  add_tensor(d, "x", {2, 8, 8, 4}, engine::StorageKind::kInput, 0, 0);
  add_tensor(d, "w", {6, 3, 3, 2}, engine::StorageKind::kWeight, 0, 0);
  add_tensor(d, "bias", {6}, engine::StorageKind::kWeight, 0, 512);
  add_tensor(d, "z", {2, 4, 4, 6}, engine::StorageKind::kInput, 1, 0);
  add_tensor(d, "out", {2, 4, 4, 6}, engine::StorageKind::kOutput, 0, 0);
  d.inputs = {0, 3};
  d.outputs = {4};
  d.arena_bytes = 256;
  const std::vector<float> w = random_floats(rng, 6 * 3 * 3 * 2), bias = random_floats(rng, 6);
  d.weights.assign(768, 0);
  std::memcpy(d.weights.data(), w.data(), w.size() * 4);
  std::memcpy(d.weights.data() + 512, bias.data(), bias.size() * 4);
  engine::Step step;
  step.kind = engine::StepKind::kConv;
  step.label = "conv";
  step.conv = c;
  d.steps.push_back(step);

  auto loaded = Engine::load(d, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::shared_ptr<const Engine> eng(std::move(loaded).value());
  auto ctx = ExecutionContext::create(eng);
  ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();

  const std::vector<float> x = random_floats(rng, 2 * 8 * 8 * 4), z = random_floats(rng, 192);
  std::vector<float> out(192), want(192);
  const int64_t cg = c.c / c.groups, kg = c.k / c.groups;
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t p = 0; p < c.p; ++p)
      for (int64_t q = 0; q < c.q; ++q)
        for (int64_t k = 0; k < c.k; ++k) {
          double acc = bias[k] + z[((n * c.p + p) * c.q + q) * c.k + k];
          const int64_t g = k / kg;
          for (int64_t r = 0; r < c.r; ++r)
            for (int64_t s = 0; s < c.s; ++s) {
              const int64_t h = p * c.stride_h - c.pad_h + r * c.dilation_h;
              const int64_t wi = q * c.stride_w - c.pad_w + s * c.dilation_w;
              if (h < 0 || h >= c.h || wi < 0 || wi >= c.w_in) continue;
              for (int64_t ci = 0; ci < cg; ++ci)
                acc += double(x[((n * c.h + h) * c.w_in + wi) * c.c + g * cg + ci]) *
                       w[((k * c.r + r) * c.s + s) * cg + ci];
            }
          want[((n * c.p + p) * c.q + q) * c.k + k] = static_cast<float>(std::max(acc, 0.0));
        }
  const void* inputs[] = {x.data(), z.data()};
  const size_t in_bytes[] = {x.size() * 4, z.size() * 4};
  void* outputs[] = {out.data()};
  const size_t out_bytes[] = {out.size() * 4};
  for (int run = 0; run < 2; ++run) {
    Status st = ctx.value()->execute_host(inputs, in_bytes, outputs, out_bytes, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_LT(rel_error(out, want), 1e-5) << "run " << run;
  }
  std::printf("conv step: algo %d, %s, workspace %zu bytes, key %s\n",
              static_cast<int>(conv_step_plan(*eng, 0)->algo), conv_step_plan(*eng, 0)->fused ? "fused" : "unfused",
              conv_step_plan(*eng, 0)->workspace_bytes, conv_step_plan(*eng, 0)->key.c_str());
}

// out[b] = a[b] @ W (W broadcast, stride 0) through cuBLASLt's strided batch.
TEST(RuntimeConvGpu, BatchedGemmWithBroadcastMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(99);
  const int64_t B = 3, M = 5, N = 7, K = 4;
  engine::EngineDesc d;
  add_tensor(d, "a", {B, M, K}, engine::StorageKind::kInput, 0, 0);
  add_tensor(d, "w", {K, N}, engine::StorageKind::kWeight, 0, 0);
  add_tensor(d, "out", {B, M, N}, engine::StorageKind::kOutput, 0, 0);
  d.inputs = {0};
  d.outputs = {2};
  d.arena_bytes = 256;
  const std::vector<float> w = random_floats(rng, K * N);
  d.weights.assign(w.size() * 4, 0);
  std::memcpy(d.weights.data(), w.data(), w.size() * 4);
  engine::Step step;
  step.kind = engine::StepKind::kGemm;
  step.label = "bmm";
  step.gemm.a = 0, step.gemm.b = 1, step.gemm.out = 2;
  step.gemm.m = M, step.gemm.n = N, step.gemm.k = K;
  step.gemm.batch = B, step.gemm.stride_a = M * K, step.gemm.stride_b = 0,
  step.gemm.stride_out = M * N;
  d.steps.push_back(step);
  auto loaded = Engine::load(d, 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::shared_ptr<const Engine> eng(std::move(loaded).value());
  auto ctx = ExecutionContext::create(eng);
  ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
  const std::vector<float> a = random_floats(rng, B * M * K);
  std::vector<float> out(B * M * N), want(B * M * N);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(a[(b * M + m) * K + k]) * w[k * N + n];
        want[(b * M + m) * N + n] = static_cast<float>(acc);
      }
  const void* inputs[] = {a.data()};
  const size_t in_bytes[] = {a.size() * 4};
  void* outputs[] = {out.data()};
  const size_t out_bytes[] = {out.size() * 4};
  Status st = ctx.value()->execute_host(inputs, in_bytes, outputs, out_bytes, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_LT(rel_error(out, want), 1e-5);
}

}  // namespace
}  // namespace kiln::runtime
