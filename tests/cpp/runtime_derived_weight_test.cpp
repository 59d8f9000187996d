// Engine format v6 on the GPU: derived weights made at load, and persistent
// kernel steps whose grid is the co-resident block count.
//
// Without a GPU: the test kernels compile with NVRTC (so a typo shows here,
// not first on the GPU machine). With a GPU (skipped, saying so, when there is
// none): hand-built engines run through Engine + ExecutionContext:
//   - a derived weight made of strided copies (a transposed block layout of a
//     random weight, 16-byte columns read with a large stride, wide rows, a
//     single row, zero gaps) is copied to the engine's output by a kernel step
//     and compared with the layout computed here, with the weight inline and
//     named (externalize_weights);
//   - a persistent kernel compiled with __cluster_dims__(2, 1, 1) and 120 KB of
//     dynamic shared memory gets the largest co-resident grid, a whole number of
//     clusters, <= grid[0]; its blocks meet at a grid-wide barrier (each waits,
//     bounded, for all the others), which proves they were all resident; it is
//     launched the classic way in a module whose other kernels launch early;
//   - the same without clusters (blocks per SM x SMs);
//   - min_blocks above what fits is refused at load with kIncompatible naming
//     the step.
// Random data comes from std::random_device; the seed is printed with every
// failure (KILN_TEST_SEED replays one).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codegen/nvrtc_compiler.h"
#include "engine_desc_builder.h"
#include "engine_format/engine_format.h"
#include "green_context.h"
#include "runtime/device.h"
#include "runtime/engine.h"
#include "runtime/execution_context.h"
#include "runtime/log.h"
#include "runtime/steps/kernel_step_exec.h"

namespace kiln::runtime {
namespace {

using engine::DType;
using engine::EngineDesc;
using engine::StorageKind;

uint32_t test_seed() {
  if (const char* env = std::getenv("KILN_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  return std::random_device{}();
}

#define SEEDED_RNG(rng)                                                  \
  const uint32_t rng##_seed = test_seed();                               \
  SCOPED_TRACE(::testing::Message() << "KILN_TEST_SEED=" << rng##_seed); \
  std::mt19937 rng(rng##_seed)

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    Status gpu = check_gpu_available();                                      \
    if (!gpu.is_ok()) GTEST_SKIP() << "needs a CUDA GPU: " << gpu.message(); \
  } while (0)

// Copies n 32-bit words; the engine's output is arg 0 and n is at most its
// element count (the kernel-step validator's convention).
const char* const kCopySource = R"(
extern "C" __global__ void kiln_test_copy_words(unsigned int* out, const unsigned int* in, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = in[i];
}
)";

// A persistent kernel: every block arrives at a counter and waits (bounded,
// 4M polls, seconds) until all gridDim.x blocks have arrived, which happens only when
// they are all resident at once. out[0] = gridDim.x; out[1 + b] = 1 when block
// b saw every block arrive, 2 when it gave up waiting. `counter` is an engine
// input, so every run starts it at 0. KILN_TEST_CLUSTER is replaced by the
// cluster attribute (or nothing).
const char* const kPersistentSource = R"(
extern "C" __global__ void KILN_TEST_CLUSTER kiln_test_persistent(unsigned int* out, unsigned int* counter) {
  extern __shared__ unsigned char dynamic_shared[];
  if (threadIdx.x != 0) return;
  dynamic_shared[0] = 1;
  __threadfence();
  atomicAdd(counter, 1u);
  unsigned int result = 2;
  for (long long polls = 0; polls < (1ll << 22); ++polls) {
    if (atomicAdd(counter, 0u) >= gridDim.x) {
      result = 1;
      break;
    }
    __nanosleep(64);
  }
  out[1 + blockIdx.x] = result;
  if (blockIdx.x == 0) out[0] = gridDim.x;
}

// A plain kernel in the same module: launched early (programmatically) on
// sm_90+ when the engine was built with overlap_launches.
extern "C" __global__ void kiln_test_plain(unsigned int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 7;
}
)";

std::string persistent_source(bool cluster) {
  std::string s = kPersistentSource;
  const std::string mark = "KILN_TEST_CLUSTER";
  s.replace(s.find(mark), mark.size(), cluster ? "__cluster_dims__(2, 1, 1)" : "");
  return s;
}

// NVRTC builds the module for `sm` (cubin + PTX); a compile error fails the test.
bool compile(const std::string& name, const std::string& source, uint32_t sm, engine::KernelModule* out,
             bool grid_dependency = false) {
  try {
    *out = codegen::compile_module(name, source, {sm}, true, {}, grid_dependency);
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "NVRTC: " << e.what();
    return false;
  }
}

TEST(DerivedWeightKernels, CompileWithNvrtc) {
  engine::KernelModule m;
  EXPECT_TRUE(compile("derived_copy", kCopySource, 90, &m));
  EXPECT_FALSE(m.cubins.empty());
  EXPECT_TRUE(compile("persistent_cluster", persistent_source(true), 90, &m, true));
  EXPECT_FALSE(m.cubins.empty());
  EXPECT_TRUE(compile("persistent", persistent_source(false), 90, &m));
}

using testing::add_tensor;  // engine_desc_builder.h

engine::Step kernel_step(const std::string& label, const std::string& function, uint32_t grid, uint32_t block,
                         std::vector<engine::KernelArg> args) {
  engine::Step s;
  s.kind = engine::StepKind::kKernel;
  s.label = label;
  s.kernel.module = 0;
  s.kernel.function = function;
  s.kernel.grid[0] = grid;
  s.kernel.block[0] = block;
  s.kernel.args = std::move(args);
  return s;
}

engine::KernelArg tensor_arg(uint32_t t) {
  engine::KernelArg a;
  a.kind = engine::KernelArgKind::kTensor;
  a.tensor = t;
  return a;
}

engine::KernelArg int_arg(int64_t v) {
  engine::KernelArg a;
  a.kind = engine::KernelArgKind::kInt64;
  a.i64 = v;
  return a;
}

// Named data in memory, for engines whose weights were externalized.
class MapWeightSource : public WeightSource {
 public:
  std::map<std::string, std::vector<uint8_t>> data;
  Status read(const std::string& key, const std::function<Status(const void*, size_t)>& use) const override {
    auto it = data.find(key);
    if (it == data.end()) return make_status(StatusCode::kCorruptData, "no named data '%s'", key.c_str());
    return use(it->second.data(), it->second.size());
  }
};

// Info lines the runtime logs during a test.
std::vector<std::string>& captured_log() {
  static std::vector<std::string> lines;
  return lines;
}
void capture(LogLevel level, const char* message) {
  if (level != LogLevel::kDebug) captured_log().push_back(message);
}
struct LogCapture {
  LogCapture() {
    captured_log().clear();
    set_log_sink(capture);
  }
  ~LogCapture() { set_log_sink(nullptr); }
  bool has(const std::string& sub) const {
    for (const std::string& line : captured_log())
      if (line.find(sub) != std::string::npos) return true;
    return false;
  }
};

// ---- derived weights ------------------------------------------------------------

// W: [kRows, kCols] float32, 4 KiB rows. The derived weight:
//   [0, kBlocks * kRows * 16): the transposed block layout: for each 16-byte
//       column block j, its kRows rows one after another (16-byte columns read
//       kRowBytes = 4096 bytes apart);
//   then every 8th row's first 256 bytes (stride 32 KiB), 32 rows;
//   then one whole row (one copy of 1 row), row 5;
//   then zeros to the end (never written).
constexpr int64_t kRows = 256, kCols = 1024;
constexpr uint64_t kRowBytes = kCols * 4;
constexpr uint32_t kBlocks = 48;  // column blocks copied (of 256)

std::vector<engine::DerivedCopy> derived_copies(uint32_t source, uint64_t* nbytes) {
  std::vector<engine::DerivedCopy> copies;
  uint64_t dst = 0;
  for (uint32_t j = 0; j < kBlocks; ++j) {
    // Blocks in a scrambled order, so a copy that ignored `offset` would show.
    const uint32_t block = (j * 37 + 11) % (kRowBytes / 16);
    copies.push_back({source, block * 16ull, kRowBytes, dst, static_cast<uint32_t>(kRows), 16});
    dst += kRows * 16;
  }
  copies.push_back({source, 0, 8 * kRowBytes, dst, static_cast<uint32_t>(kRows / 8), 256});
  dst += (kRows / 8) * 256;
  copies.push_back({source, 5 * kRowBytes, 0, dst, 1, static_cast<uint32_t>(kRowBytes)});
  dst += kRowBytes;
  *nbytes = dst + 4096;  // a zero tail
  return copies;
}

// The layout computed on the host from W's bytes.
std::vector<uint8_t> host_layout(const std::vector<uint8_t>& w, const std::vector<engine::DerivedCopy>& copies,
                                 uint64_t nbytes) {
  std::vector<uint8_t> out(nbytes, 0);
  for (const engine::DerivedCopy& c : copies)
    for (uint32_t r = 0; r < c.rows; ++r)
      std::memcpy(out.data() + c.dst + r * uint64_t{c.row_bytes}, w.data() + c.offset + r * c.stride, c.row_bytes);
  return out;
}

// An engine with weight W (inline), the derived weight, and two kernel steps
// copying it (all of it; and a view at an offset) to the outputs.
EngineDesc derived_engine(const std::vector<uint8_t>& w, const engine::KernelModule& module,
                          std::vector<engine::DerivedCopy>* copies_out, uint64_t* nbytes_out) {
  EngineDesc d;
  const uint32_t weight = add_tensor(d, "w", DType::kFloat32, {kRows, kCols}, StorageKind::kWeight, 0, 0);
  d.weights = w;
  uint64_t nbytes = 0;
  std::vector<engine::DerivedCopy> copies = derived_copies(weight, &nbytes);
  d.derived_weights.push_back({"w.blocks", nbytes, copies});
  const int64_t words = static_cast<int64_t>(nbytes / 4);
  const uint32_t packed = add_tensor(d, "w.blocks", DType::kFloat32, {words}, StorageKind::kDerivedWeight, 0, 0);
  // A view of the part after the column blocks (offset into the derived weight).
  const uint64_t tail_offset = kBlocks * kRows * 16;
  const int64_t tail_words = static_cast<int64_t>((nbytes - tail_offset) / 4);
  const uint32_t tail =
      add_tensor(d, "w.blocks.tail", DType::kFloat32, {tail_words}, StorageKind::kDerivedWeight, 0, tail_offset);
  const uint32_t out = add_tensor(d, "out", DType::kFloat32, {words}, StorageKind::kOutput, 0, 0);
  const uint32_t out_tail = add_tensor(d, "out_tail", DType::kFloat32, {tail_words}, StorageKind::kOutput, 1, 0);
  d.outputs = {out, out_tail};
  d.arena_bytes = 256;
  d.modules.push_back(module);
  d.steps.push_back(kernel_step("copy", "kiln_test_copy_words", 264, 256,
                                {tensor_arg(out), tensor_arg(packed), int_arg(words)}));
  d.steps.push_back(kernel_step("copy_tail", "kiln_test_copy_words", 32, 256,
                                {tensor_arg(out_tail), tensor_arg(tail), int_arg(tail_words)}));
  *copies_out = copies;
  *nbytes_out = nbytes;
  return d;
}

// Fresh random float32 bits, never all zeros or ones: normal values in (-4, 4).
std::vector<uint8_t> random_weight(std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> v(kRows * kCols);
  for (float& x : v) x = dist(rng);
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

void run_and_compare(std::shared_ptr<const Engine> eng, const std::vector<uint8_t>& want, uint64_t tail_offset) {
  auto ctx = ExecutionContext::create(eng);
  ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
  std::vector<uint8_t> out(want.size(), 0xAB), tail(want.size() - tail_offset, 0xCD);
  void* outputs[] = {out.data(), tail.data()};
  const size_t out_bytes[] = {out.size(), tail.size()};
  Status st = ctx.value()->execute_host(nullptr, nullptr, outputs, out_bytes, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  size_t first_bad = out.size();
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i] != want[i]) {
      first_bad = i;
      break;
    }
  EXPECT_EQ(first_bad, out.size()) << "first differing byte of the derived weight";
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), want.begin() + tail_offset))
      << "the view at offset " << tail_offset << " reads other bytes";
}

class DerivedWeightGpu : public ::testing::TestWithParam<bool> {};  // param: named weight

TEST_P(DerivedWeightGpu, MadeAtLoadMatchesTheHostLayout) {
  SKIP_WITHOUT_GPU();
  const bool named = GetParam();
  SEEDED_RNG(rng);
  engine::KernelModule module;
  auto device = query_device(0);
  ASSERT_TRUE(device.is_ok()) << device.status().to_string();
  ASSERT_TRUE(compile("derived_copy", kCopySource, static_cast<uint32_t>(device->sm), &module));
  const std::vector<uint8_t> w = random_weight(rng);
  std::vector<engine::DerivedCopy> copies;
  uint64_t nbytes = 0;
  EngineDesc d = derived_engine(w, module, &copies, &nbytes);
  const std::vector<uint8_t> want = host_layout(w, copies, nbytes);
  ASSERT_NE(std::count(want.begin(), want.end(), uint8_t{0}), static_cast<std::ptrdiff_t>(want.size()));

  MapWeightSource source;
  if (named) {
    auto split = engine::externalize_weights(&d, "kiln/derived-test/");
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    ASSERT_EQ(d.tensors[0].storage, StorageKind::kNamedWeight);
    for (engine::ExternalWeight& x : engine::external_weights(d, std::move(split).value()))
      source.data[x.key] = std::move(x.bytes);
  }
  // Through the bytes, as a .pte would bring it.
  auto bytes = engine::serialize_engine(d);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto parsed = engine::parse_engine(bytes->data(), bytes->size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();

  LogCapture log;
  auto loaded = Engine::load(std::move(parsed).value(), 0, named ? &source : nullptr, /*share_weights=*/false);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::shared_ptr<const Engine> eng(std::move(loaded).value());
  EXPECT_EQ(eng->derived_weights_bytes(), nbytes);
  EXPECT_TRUE(log.has("made derived weight 'w.blocks': ")) << "no load log line";
  EXPECT_TRUE(log.has("from " + std::to_string(copies.size()) + " copies in "));
  const void* base = eng->weight_address(eng->desc().tensors[1]);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(eng->weight_address(eng->desc().tensors[2]), static_cast<const uint8_t*>(base) + kBlocks * kRows * 16);
  run_and_compare(eng, want, kBlocks * kRows * 16);
}

INSTANTIATE_TEST_SUITE_P(InlineAndNamed, DerivedWeightGpu, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "NamedWeight" : "InlineWeight");
                         });

// ---- persistent kernel steps -----------------------------------------------------

constexpr uint32_t kMaxGrid = 4096;
constexpr uint32_t kPersistentShared = 120 * 1024;  // at most one block per SM
constexpr uint32_t kPersistentThreads = 128;

// Step 0: the persistent kernel (grid[0] = kMaxGrid, min_blocks `min_blocks`);
// step 1: a plain kernel of the same module. overlap_launches is baked in, so
// on sm_90+ the module's kernels launch programmatically, except the
// persistent one.
EngineDesc persistent_engine(const engine::KernelModule& module, uint32_t min_blocks) {
  EngineDesc d;
  const uint32_t out = add_tensor(d, "out", DType::kInt32, {1 + kMaxGrid}, StorageKind::kOutput, 0, 0);
  const uint32_t counter = add_tensor(d, "counter", DType::kInt32, {1}, StorageKind::kInput, 0, 0);
  const uint32_t plain = add_tensor(d, "plain", DType::kInt32, {1}, StorageKind::kOutput, 1, 0);
  d.inputs = {counter};
  d.outputs = {out, plain};
  d.arena_bytes = 256;
  d.modules.push_back(module);
  engine::Step p = kernel_step("persistent", "kiln_test_persistent", kMaxGrid, kPersistentThreads,
                               {tensor_arg(out), tensor_arg(counter)});
  p.kernel.shared_bytes = kPersistentShared;
  p.kernel.min_blocks = min_blocks;
  d.steps.push_back(p);
  d.steps.push_back(kernel_step("plain", "kiln_test_plain", 1, 32, {tensor_arg(plain)}));
  d.metadata = {{"overlap_launches", "true"}};
  return d;
}

// What the runtime should choose, computed here with the CUDA occupancy API on
// the module loaded separately.
uint32_t expected_grid(const engine::KernelModule& module, int sm, int sm_count, bool cluster) {
  const engine::CubinImage* cubin = nullptr;
  for (const engine::CubinImage& c : module.cubins)
    if (static_cast<int>(c.sm) == sm) cubin = &c;
  EXPECT_NE(cubin, nullptr);
  if (cubin == nullptr) return 0;
  cudaLibrary_t library = nullptr;
  EXPECT_EQ(cudaLibraryLoadData(&library, cubin->image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            cudaSuccess);
  cudaKernel_t kernel = nullptr;
  EXPECT_EQ(cudaLibraryGetKernel(&kernel, library, "kiln_test_persistent"), cudaSuccess);
  const void* func = reinterpret_cast<const void*>(kernel);
  EXPECT_EQ(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, kPersistentShared), cudaSuccess);
  uint64_t co_resident = 0;
  if (cluster) {
    cudaFuncAttributes attr{};
    EXPECT_EQ(cudaFuncGetAttributes(&attr, func), cudaSuccess);
    EXPECT_EQ(attr.requiredClusterWidth, 2) << "__cluster_dims__(2, 1, 1)";
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(2, 1, 1);
    config.blockDim = dim3(kPersistentThreads, 1, 1);
    config.dynamicSmemBytes = kPersistentShared;
    int clusters = 0;
    EXPECT_EQ(cudaOccupancyMaxActiveClusters(&clusters, func, &config), cudaSuccess);
    co_resident = 2ull * clusters;
  } else {
    int per_sm = 0;
    EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, func, kPersistentThreads, kPersistentShared),
              cudaSuccess);
    EXPECT_EQ(per_sm, 1) << "120 KB of shared memory per block";
    co_resident = static_cast<uint64_t>(per_sm) * sm_count;
  }
  (void)cudaLibraryUnload(library);
  uint64_t grid = std::min<uint64_t>(kMaxGrid, co_resident);
  if (cluster) grid -= grid % 2;
  return static_cast<uint32_t>(grid);
}

// One run of persistent_engine's context on `stream`: the persistent kernel's output (gridDim.x,
// then 1 for each block that met all the others, 2 for one that gave up waiting) and the plain one's.
struct PersistentRun {
  Status status;
  std::vector<uint32_t> out = std::vector<uint32_t>(1 + kMaxGrid, 0);
  uint32_t plain = 0;
  uint32_t count(uint32_t blocks, uint32_t what) const {
    uint32_t n = 0;
    for (uint32_t b = 0; b < blocks; ++b) n += out[1 + b] == what;
    return n;
  }
};
PersistentRun run_persistent(ExecutionContext& ctx, cudaStream_t stream) {
  PersistentRun r;
  const uint32_t zero = 0;
  const void* inputs[] = {&zero};
  const size_t in_bytes[] = {4};
  void* outputs[] = {r.out.data(), &r.plain};
  const size_t out_bytes[] = {r.out.size() * 4, 4};
  r.status = ctx.execute_host(inputs, in_bytes, outputs, out_bytes, stream);
  return r;
}

// param: cluster kernel. SetUp skips without an sm_90+ GPU that has the shared memory, and
// compiles the test kernels for it.
class PersistentGridGpu : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cluster_ = GetParam();
    auto device = query_device(0);
    ASSERT_TRUE(device.is_ok()) << device.status().to_string();
    device_ = device.value();
    if (device_.sm < 90) GTEST_SKIP() << "clusters and programmatic launches need sm_90+; this GPU is sm_" << device_.sm;
    if (device_.max_shared_per_block_optin < kPersistentShared)
      GTEST_SKIP() << "needs " << kPersistentShared << " bytes of shared memory per block";
    ASSERT_TRUE(compile(cluster_ ? "persistent_cluster" : "persistent", persistent_source(cluster_),
                        static_cast<uint32_t>(device_.sm), &module_, /*grid_dependency=*/true));
  }
  bool cluster_ = false;
  DeviceInfo device_;
  engine::KernelModule module_;
};

TEST_P(PersistentGridGpu, GridIsTheCoResidentCountAndAllBlocksMeet) {
  const bool cluster = cluster_;
  const DeviceInfo* device = &device_;
  const engine::KernelModule& module = module_;
  const uint32_t want = expected_grid(module, device->sm, device->sm_count, cluster);
  ASSERT_GE(want, 2u);
  ASSERT_LT(want, kMaxGrid) << "grid[0] must be larger than what fits, for this test";

  LogCapture log;
  auto loaded = Engine::load(persistent_engine(module, 2), 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::shared_ptr<const Engine> eng(std::move(loaded).value());
  KernelStepLaunch launch, plain;
  ASSERT_TRUE(kernel_step_launch(*eng, 0, &launch));
  ASSERT_TRUE(kernel_step_launch(*eng, 1, &plain));
  EXPECT_EQ(launch.grid[0], want);
  EXPECT_EQ(launch.grid[1], 1u);
  EXPECT_EQ(launch.grid[2], 1u);
  EXPECT_LE(launch.grid[0], kMaxGrid);
  if (cluster) {
    EXPECT_EQ(launch.grid[0] % 2, 0u);
  }
  EXPECT_FALSE(launch.programmatic) << "a persistent kernel never launches early";
  EXPECT_TRUE(plain.programmatic) << "the module's other kernels do (overlap_launches, sm_90+)";
  EXPECT_TRUE(log.has("step 0 ('persistent'): kernel 'kiln_test_persistent'"));
  EXPECT_TRUE(log.has("persistent kernel: grid of " + std::to_string(want) + " blocks"));
  std::printf("persistent grid%s on %s (%d SMs): %u blocks\n", cluster ? " (clusters of 2)" : "",
              device->name.c_str(), device->sm_count, launch.grid[0]);

  auto ctx = ExecutionContext::create(eng);
  ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const PersistentRun r = run_persistent(*ctx.value(), nullptr);
    ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
    EXPECT_EQ(r.out[0], want) << "gridDim.x seen by the kernel";
    EXPECT_EQ(r.count(want, 1), want) << r.count(want, 2) << " blocks waited in vain: not all were resident at once";
    EXPECT_EQ(r.plain, 7u);
  }
}

TEST_P(PersistentGridGpu, MoreMinBlocksThanFitIsRefusedNamingTheStep) {
  const engine::KernelModule& module = module_;
  const uint32_t fits = expected_grid(module, device_.sm, device_.sm_count, cluster_);
  ASSERT_LT(fits, kMaxGrid);
  auto loaded = Engine::load(persistent_engine(module, fits + 1), 0);
  ASSERT_FALSE(loaded.is_ok());
  const Status& st = loaded.status();
  EXPECT_EQ(st.code(), StatusCode::kIncompatible) << st.to_string();
  for (const std::string& sub :
       {std::string("step 0 ('persistent'): kernel 'kiln_test_persistent'"),
        "needs at least " + std::to_string(fits + 1) + " blocks (min_blocks)", std::string("all must be resident"),
        "gives it " + std::to_string(fits)})
    EXPECT_NE(st.message().find(sub), std::string::npos) << "missing '" << sub << "' in: " << st.message();
  // The largest min_blocks that fits loads.
  EXPECT_TRUE(Engine::load(persistent_engine(module, fits), 0).is_ok());
}

// The grid chosen at load fills the whole GPU; a green context's stream holds fewer SMs, where the
// blocks could never all be resident: execute refuses that stream, naming the step, and the same
// context still runs on the whole GPU afterwards.
TEST_P(PersistentGridGpu, AStreamWithTooFewSmsIsRefusedAtExecute) {
  kiln::tools::DeviceSmInfo sms;
  if (std::string why = kiln::tools::query_device_sms(&sms); !why.empty()) GTEST_SKIP() << "no green contexts: " << why;
  std::unique_ptr<kiln::tools::GreenContext> green;
  const unsigned few = std::max(sms.min_partition, std::min(16u, sms.sm_count / 4));
  if (std::string why = kiln::tools::GreenContext::create(few, &green); !why.empty())
    GTEST_SKIP() << "no green context of " << few << " SMs: " << why;
  auto loaded = Engine::load(persistent_engine(module_, 2), 0);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::shared_ptr<const Engine> eng(std::move(loaded).value());
  KernelStepLaunch launch;
  ASSERT_TRUE(kernel_step_launch(*eng, 0, &launch));
  ASSERT_GT(launch.grid[0], green->obtained_sms()) << "one block per SM: the green context cannot hold the grid";
  auto ctx = ExecutionContext::create(eng);
  ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
  const PersistentRun refused = run_persistent(*ctx.value(), green->stream());
  const Status& st = refused.status;
  ASSERT_FALSE(st.is_ok()) << "ran " << launch.grid[0] << " waiting blocks on " << green->obtained_sms() << " SMs";
  EXPECT_EQ(st.code(), StatusCode::kIncompatible) << st.to_string();
  for (const std::string& sub : {std::string("step 0 ('persistent')"), "runs " + std::to_string(launch.grid[0]) + " blocks",
                                 std::string("the SMs of the stream")})
    EXPECT_NE(st.message().find(sub), std::string::npos) << "missing '" << sub << "' in: " << st.message();
  EXPECT_EQ(refused.out[0], 0u) << "nothing ran";
  std::printf("green context of %u SMs: %s\n", green->obtained_sms(), st.message().c_str());
  const PersistentRun whole = run_persistent(*ctx.value(), nullptr);
  ASSERT_TRUE(whole.status.is_ok()) << whole.status.to_string();
  EXPECT_EQ(whole.out[0], launch.grid[0]);
  EXPECT_EQ(whole.count(launch.grid[0], 1), launch.grid[0]);
}

INSTANTIATE_TEST_SUITE_P(ClusterAndPlain, PersistentGridGpu, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Cluster2" : "NoCluster");
                         });

}  // namespace
}  // namespace kiln::runtime
