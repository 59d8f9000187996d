// Export-time compilation: one NVRTC compile to PTX for the oldest SM, then a
// cubin per SM assembled on threads gives the same bytes as one at a time;
// the cubins are for their SMs; the in-process cache serves repeats (and
// never confuses two sources). Real NVRTC and nvJitLink; no GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "codegen/grid_dependency.h"
#include "codegen/nvrtc_compiler.h"
#include "codegen/sha256.h"
#include "ir/graph.h"

namespace kiln::codegen {
namespace {

// A few kernels with random constants, so each test compiles a source no
// earlier test (or run) has cached.
std::string random_source(int kernels) {
  static std::mt19937 rng(std::random_device{}());
  std::string source = "__device__ float kiln_sq(float x) { return x * x; }\n";
  for (int k = 0; k < kernels; ++k) {
    const float scale = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
    source += "extern \"C\" __global__ void k" + std::to_string(k) +
              "(float* out, const float* in, long long n) {\n"
              "  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += gridDim.x * 256LL)\n"
              "    out[i] = kiln_sq(in[(i / " + std::to_string(k + 2) + "LL) % 97LL]) * " +
              std::to_string(scale) + "f;\n}\n";
  }
  return source;
}

void set_threads(const char* value) {
  if (value)
    setenv("KILN_NVRTC_THREADS", value, 1);
  else
    unsetenv("KILN_NVRTC_THREADS");
}

// The ELF header's e_flags hold the SM a cubin is for (bits 8-15 in CUDA 13's
// cubins: 0x6005a04 for sm_90); the full check is the GPU test
// (tests/gpu/sm_targets_test.py).
uint32_t cubin_sm(const std::vector<uint8_t>& image) {
  if (image.size() < 52 || image[0] != 0x7f || image[1] != 'E') return 0;
  uint32_t flags = 0;
  for (int b = 3; b >= 0; --b) flags = (flags << 8) | image[48 + b];
  return (flags >> 8) & 0xff;
}

TEST(NvrtcCompiler, ThreadedEqualsSerialAndPtxIsForTheOldestSm) {
  const std::string source = random_source(6);
  const std::vector<uint32_t> sms = {80, 86, 87, 89, 90, 100, 110, 120};
  set_threads("1");
  engine::KernelModule serial = compile_module("m", source, sms, true);
  clear_nvrtc_cache();  // the threaded run must compile, not hit the cache
  set_threads("4");
  engine::KernelModule threaded = compile_module("m", source, sms, true);
  set_threads(nullptr);
  // One NVRTC compile; the SMs are assembled from its PTX.
  EXPECT_EQ(nvrtc_cache_stats().compiles, 1u);
  EXPECT_EQ(nvrtc_cache_stats().assembles, sms.size());

  ASSERT_EQ(threaded.cubins.size(), sms.size());
  for (size_t i = 0; i < sms.size(); ++i) {
    EXPECT_EQ(threaded.cubins[i].sm, sms[i]);
    EXPECT_FALSE(threaded.cubins[i].image.empty());
    EXPECT_EQ(threaded.cubins[i].image, serial.cubins[i].image);
    // Machine code for its own SM, not a copy of another's.
    EXPECT_EQ(cubin_sm(threaded.cubins[i].image), sms[i]) << "sm_" << sms[i];
  }
  EXPECT_NE(threaded.cubins[0].image, threaded.cubins[4].image);
  EXPECT_EQ(threaded.ptx_sm, 80u);
  EXPECT_EQ(threaded.ptx, serial.ptx);
  EXPECT_NE(threaded.ptx.find(".target sm_80"), std::string::npos);
  EXPECT_EQ(threaded.source, source);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// overlap_launches: the sm_90+ cubins come from PTX with griddepcontrol at
// the top of every entry (the trigger, then the wait); older cubins and the
// kept PTX are the plain build.
TEST(GridDependency, Sm90CubinsWaitOlderOnesAndThePtxDoNot) {
  const std::string source = random_source(3);
  const std::vector<uint32_t> sms = {80, 90, 100};
  engine::KernelModule plain = compile_module("m", source, sms, true);
  engine::KernelModule overlap = compile_module("m", source, sms, true, {}, true);
  ASSERT_EQ(overlap.cubins.size(), 3u);
  EXPECT_EQ(overlap.ptx, plain.ptx);  // the JIT path never waits
  EXPECT_EQ(count(overlap.ptx, "griddepcontrol"), 0u);
  EXPECT_EQ(overlap.cubins[0].image, plain.cubins[0].image);  // sm_80: no griddepcontrol there
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(cubin_sm(overlap.cubins[i].image), sms[i]);
    EXPECT_NE(overlap.cubins[i].image, plain.cubins[i].image) << "sm_" << sms[i];
  }

  const std::string patched = add_grid_dependency(plain.ptx);
  EXPECT_EQ(count(patched, ".target sm_90"), 1u);
  EXPECT_EQ(count(patched, ".target sm_80"), 0u);
  const size_t entries = count(plain.ptx, ".entry ");
  ASSERT_EQ(entries, 3u);
  EXPECT_EQ(count(patched, "griddepcontrol.wait;"), entries);
  EXPECT_EQ(count(patched, "griddepcontrol.launch_dependents;"), entries);
  // Each entry's body starts with the wait, then the trigger.
  const std::string top = "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n";
  for (size_t p = patched.find(".entry "); p != std::string::npos; p = patched.find(".entry ", p + 1)) {
    const size_t body = patched.find("{\n", p);
    ASSERT_NE(body, std::string::npos);
    EXPECT_EQ(patched.compare(body + 2, top.size(), top), 0);
  }
}

// A kernel that places its wait (grid_dependency_wait()) gets it there: the
// trigger stays first, the code above the marker runs before the wait, and
// the other entries keep the wait at the top.
TEST(GridDependency, AMarkerPlacesTheWait) {
  const std::string source =
      "extern \"C\" __global__ void early(const float* __restrict__ w, const float* x, float* out) {\n"
      "  const float a = __ldg(w + threadIdx.x);\n"
      "  " + grid_dependency_wait() + "\n"
      "  out[threadIdx.x] = a * x[threadIdx.x];\n"
      "}\n"
      "extern \"C\" __global__ void plain(const float* x, float* out) { out[threadIdx.x] = x[threadIdx.x] + 1.0f; }\n";
  engine::KernelModule m = compile_module("m", source, {80, 90}, true, {}, true);
  ASSERT_EQ(m.cubins.size(), 2u);
  EXPECT_EQ(count(m.ptx, kGridDependencyWaitMarker), 1u);  // a comment in the JIT PTX
  const std::string patched = add_grid_dependency(m.ptx);
  EXPECT_EQ(count(patched, kGridDependencyWaitMarker), 0u);
  EXPECT_EQ(count(patched, "griddepcontrol.wait;"), 2u);
  EXPECT_EQ(count(patched, "griddepcontrol.launch_dependents;"), 2u);
  const size_t early = patched.find(".entry early");
  const size_t plain = patched.find(".entry plain");
  ASSERT_NE(early, std::string::npos);
  ASSERT_NE(plain, std::string::npos);
  const size_t first = std::min(early, plain), second = std::max(early, plain);
  const std::string early_text = early < plain ? patched.substr(first, second - first) : patched.substr(second);
  const std::string plain_text = early < plain ? patched.substr(second) : patched.substr(first, second - first);
  const size_t load = early_text.find("ld.global.nc"), wait = early_text.find("griddepcontrol.wait;");
  ASSERT_NE(load, std::string::npos);
  EXPECT_LT(early_text.find("griddepcontrol.launch_dependents;"), load);
  EXPECT_LT(load, wait);
  const size_t body = plain_text.find("{\n");
  const std::string top = "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n";
  EXPECT_EQ(plain_text.compare(body + 2, top.size(), top), 0);
}

// A kernel that places its wait may place its trigger too: no trigger at the
// top, the wait where its marker is, the trigger where its marker is. A
// trigger marker without a wait marker, or two in one entry, is refused.
TEST(GridDependency, ATriggerMarkerPlacesTheTrigger) {
  const std::string source =
      "extern \"C\" __global__ void late(const float* __restrict__ w, const float* x, float* out) {\n"
      "  const float a = __ldg(w + threadIdx.x);\n"
      "  " + grid_dependency_wait() + "\n"
      "  const float b = a * x[threadIdx.x];\n"
      "  " + grid_dependency_trigger() + "\n"
      "  out[threadIdx.x] = b;\n"
      "}\n";
  engine::KernelModule m = compile_module("m", source, {80, 90}, true, {}, true);
  const std::string patched = add_grid_dependency(m.ptx);
  EXPECT_EQ(count(patched, kGridDependencyTriggerMarker), 0u);
  ASSERT_EQ(count(patched, "griddepcontrol.wait;"), 1u);
  ASSERT_EQ(count(patched, "griddepcontrol.launch_dependents;"), 1u);
  const size_t load = patched.find("ld.global.nc"), wait = patched.find("griddepcontrol.wait;");
  const size_t trigger = patched.find("griddepcontrol.launch_dependents;"), store = patched.find("st.global");
  ASSERT_NE(load, std::string::npos);
  ASSERT_NE(store, std::string::npos);
  EXPECT_LT(load, wait);
  EXPECT_LT(wait, trigger);
  EXPECT_LT(trigger, store);
  const std::string wait_marker = std::string("\t// ") + kGridDependencyWaitMarker + "\n";
  const std::string trigger_marker = std::string("\t// ") + kGridDependencyTriggerMarker + "\n";
  const std::string head = ".version 9.0\n.target sm_80\n.visible .entry k(\n)\n{\n";
  EXPECT_THROW(add_grid_dependency(head + trigger_marker + "\tret;\n}\n"), CompileError);
  EXPECT_THROW(add_grid_dependency(head + wait_marker + trigger_marker + trigger_marker + "\tret;\n}\n"),
               CompileError);
}

TEST(GridDependency, RefusesTextThatIsNotNvrtcPtx) {
  const std::string marker = std::string("\t// ") + kGridDependencyWaitMarker + "\n";
  // A marker before any entry, and two in one entry.
  EXPECT_THROW(add_grid_dependency(".version 9.0\n.target sm_80\n" + marker + ".visible .entry k(\n)\n{\n\tret;\n}\n"),
               CompileError);
  EXPECT_THROW(add_grid_dependency(".version 9.0\n.target sm_80\n.visible .entry k(\n)\n{\n" + marker + marker +
                                   "\tret;\n}\n"),
               CompileError);
  EXPECT_THROW(add_grid_dependency(".version 9.0\n.visible .entry k(\n)\n{\n}\n"), CompileError);  // no .target
  EXPECT_THROW(add_grid_dependency(".version 9.0\n.target sm_80\n.visible .entry k(\n)\n"), CompileError);
  // Already sm_90: the target stays, the entry still gets the wait.
  const std::string ptx = ".version 9.0\n.target sm_100\n.address_size 64\n.visible .entry k(\n)\n{\n\tret;\n}\n";
  const std::string patched = add_grid_dependency(ptx);
  EXPECT_EQ(count(patched, ".target sm_100"), 1u);
  EXPECT_EQ(count(patched, "griddepcontrol.wait;"), 1u);
}

TEST(NvrtcCompiler, CacheServesRepeatsAndKeysOnSourceAndArch) {
  clear_nvrtc_cache();
  const std::string a = random_source(3);
  engine::KernelModule first = compile_module("m", a, {90}, true);
  NvrtcCacheStats after_first = nvrtc_cache_stats();
  EXPECT_EQ(after_first.compiles, 1u);
  EXPECT_EQ(after_first.assembles, 1u);
  EXPECT_EQ(after_first.hits, 0u);

  engine::KernelModule again = compile_module("m", a, {90}, true);
  NvrtcCacheStats after_again = nvrtc_cache_stats();
  EXPECT_EQ(after_again.compiles, 1u);
  EXPECT_EQ(after_again.assembles, 1u);
  EXPECT_EQ(after_again.hits, 2u);  // the PTX and the cubin
  EXPECT_EQ(again.cubins[0].image, first.cubins[0].image);
  EXPECT_EQ(again.ptx, first.ptx);

  // A new SM newer than the oldest assembles only that SM from the cached PTX.
  engine::KernelModule two = compile_module("m", a, {90, 100}, false);
  EXPECT_EQ(nvrtc_cache_stats().compiles, 1u);
  EXPECT_EQ(nvrtc_cache_stats().assembles, 2u);
  EXPECT_EQ(two.cubins[0].image, first.cubins[0].image);
  EXPECT_TRUE(two.ptx.empty());
  // An older SM is a new PTX (compute_87), so every cubin is assembled again from it.
  compile_module("m", a, {87, 90}, true);
  EXPECT_EQ(nvrtc_cache_stats().compiles, 2u);
  EXPECT_EQ(nvrtc_cache_stats().assembles, 4u);

  // One changed character is another source: compiled, different code.
  std::string b = a;
  b.replace(b.find("% 97LL"), 6, "% 89LL");
  engine::KernelModule other = compile_module("m", b, {90}, false);
  EXPECT_EQ(nvrtc_cache_stats().compiles, 3u);
  EXPECT_NE(other.cubins[0].image, first.cubins[0].image);
  EXPECT_GT(nvrtc_cache_stats().bytes, 0u);
}

TEST(Sha256, KnownDigests) {
  // FIPS 180-4 examples, and one over several blocks fed in pieces.
  Sha256 abc;
  abc.update("abc");
  EXPECT_EQ(abc.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 two_blocks;
  two_blocks.update("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
  EXPECT_EQ(two_blocks.hex(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(chunk);
  EXPECT_EQ(million.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The on-disk cache (KILN_KERNEL_CACHE): a second process (here: a cleared
// in-process cache) reads the PTX and cubins instead of compiling them, and
// gets the same bytes; a damaged entry is a miss that is written again.
TEST(NvrtcCompiler, DiskCacheServesAnotherProcessAndSurvivesDamage) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_kernel_cache_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  setenv("KILN_KERNEL_CACHE", dir.c_str(), 1);
  const std::string source = random_source(2);
  clear_nvrtc_cache();
  engine::KernelModule first = compile_module("m", source, {80, 90}, true);
  NvrtcCacheStats s = nvrtc_cache_stats();
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.assembles, 2u);
  EXPECT_EQ(s.disk_writes, 3u);  // the PTX and two cubins
  EXPECT_EQ(s.disk_hits, 0u);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.path().extension() == ".kc";
  EXPECT_EQ(files, 3u);

  clear_nvrtc_cache();  // as a new process
  engine::KernelModule second = compile_module("m", source, {80, 90}, true);
  s = nvrtc_cache_stats();
  EXPECT_EQ(s.compiles, 0u);
  EXPECT_EQ(s.assembles, 0u);
  EXPECT_EQ(s.disk_hits, 3u);
  EXPECT_EQ(second.ptx, first.ptx);
  ASSERT_EQ(second.cubins.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(second.cubins[i].image, first.cubins[i].image);

  // Another source is a miss (the key is the whole source).
  std::string other = source;
  other.replace(other.find("% 97LL"), 6, "% 89LL");
  compile_module("m", other, {90}, false);
  EXPECT_EQ(nvrtc_cache_stats().compiles, 1u);

  // Flip a byte in every entry: each is a miss, compiled and written again.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto last = static_cast<std::streamoff>(fs::file_size(entry.path()) - 1);
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(last);
    const char byte = static_cast<char>(f.get());
    f.seekp(last);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  clear_nvrtc_cache();
  engine::KernelModule third = compile_module("m", source, {80, 90}, true);
  s = nvrtc_cache_stats();
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.assembles, 2u);
  EXPECT_EQ(s.disk_hits, 0u);
  EXPECT_EQ(third.cubins[1].image, first.cubins[1].image);
  clear_nvrtc_cache();
  compile_module("m", source, {80, 90}, true);
  EXPECT_EQ(nvrtc_cache_stats().disk_hits, 3u);
  unsetenv("KILN_KERNEL_CACHE");
  fs::remove_all(dir);
}

TEST(NvrtcCompiler, ErrorsNameTheModuleWhenCompiledOnThreads) {
  set_threads("2");
  const std::string bad = random_source(1) + "extern \"C\" __global__ void broken() { undeclared_thing(); }\n";
  try {
    compile_module("bad_module", bad, {87, 90}, true);
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("bad_module"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("undeclared_thing"), std::string::npos) << e.what();
  }
  set_threads(nullptr);
  // A failed compile caches nothing: the same source fails again.
  EXPECT_THROW(compile_module("bad_module", bad, {90}, false), CompileError);
}

TEST(NvrtcCompiler, ProgressRunsOnTheCallingThreadAndMayThrow) {
  // A short compile reports nothing; an exception from progress (as the
  // Python callback's error) propagates after the threads are joined.
  std::vector<std::string> lines;
  compile_module("m", random_source(1), {87, 90}, true, [&](const std::string& l) { lines.push_back(l); });
  for (const std::string& l : lines) EXPECT_EQ(l.rfind("NVRTC: ", 0), 0u) << l;
  EXPECT_THROW(compile_module("m", "this is not CUDA", {87, 90}, true, [](const std::string&) {}), CompileError);
}

}  // namespace
}  // namespace kiln::codegen

// Kernels that differ only in their name and comments are compiled once: the
// later steps launch the first one (same code); any other difference keeps
// them apart.
#include "compiler/compiler.h"

namespace kiln {
namespace {

TEST(KernelDedup, IdenticalKernelsShareOneFunction) {
  using engine::DType;
  ir::Graph g;
  std::vector<int> outs;
  // Two sigmoids (identical kernels apart from the node names in comments;
  // contiguous elementwise kernels take the element count as an argument, so
  // the shapes may differ) and a relu (another kernel).
  const std::vector<std::vector<int64_t>> shapes = {{4, 6}, {4, 7}, {4, 6}};
  const char* ops[] = {"aten.sigmoid.default", "aten.sigmoid.default", "aten.relu.default"};
  for (size_t i = 0; i < shapes.size(); ++i) {
    int x = g.add_input("x" + std::to_string(i), DType::kFloat32, shapes[i]);
    int s = g.add_node(ops[i], "op_" + std::to_string(i), {x}, {}, {{DType::kFloat32, shapes[i]}});
    outs.push_back(g.nodes()[s].outputs[0]);
  }
  g.set_outputs(outs);
  std::vector<std::string> progress;
  compiler::CompileOptions options;
  options.progress = [&](const std::string& m) { progress.push_back(m); };
  engine::EngineDesc d = compiler::compile_to_desc(g, options);

  std::vector<std::string> functions;
  for (const auto& s : d.steps)
    if (s.kind == engine::StepKind::kKernel) functions.push_back(s.kernel.function);
  ASSERT_EQ(functions.size(), 3u);
  EXPECT_EQ(functions[0], functions[1]);
  EXPECT_NE(functions[0], functions[2]);
  ASSERT_EQ(d.modules.size(), 1u);
  const std::string& src = d.modules[0].source;
  size_t kernels = 0;
  for (size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) ++kernels;
  EXPECT_EQ(kernels, 2u);
  for (const std::string& f : functions) {
    EXPECT_NE(src.find(f + "("), std::string::npos) << f;
    EXPECT_NE(d.modules[0].ptx.find(".entry " + f), std::string::npos) << f;
  }
  bool said = false;
  for (const std::string& m : progress) said |= m.find("3 fused kernels (2 distinct)") != std::string::npos;
  EXPECT_TRUE(said);
  // Steps keep their own tensors: only the function is shared.
  EXPECT_NE(d.steps[0].kernel.args[0].tensor, d.steps[1].kernel.args[0].tensor);
}

// cubin_sms: the engine covers every target SM with fewer cubins (one per
// major here); the metadata keeps the targets; a set that leaves a target
// without a cubin of its major is refused.
TEST(CubinSms, OneCubinPerMajorCoversTheTargets) {
  using engine::DType;
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {4, 6});
  int s = g.add_node("aten.sigmoid.default", "sig", {x}, {}, {{DType::kFloat32, {4, 6}}});
  g.set_outputs({g.nodes()[s].outputs[0]});
  compiler::CompileOptions options;
  options.target_sms = {80, 86, 89, 90};
  options.cubin_sms = {80, 90};
  engine::EngineDesc d = compiler::compile_to_desc(g, options);
  ASSERT_EQ(d.modules.size(), 1u);
  std::vector<uint32_t> sms;
  for (const auto& c : d.modules[0].cubins) sms.push_back(c.sm);
  EXPECT_EQ(sms, (std::vector<uint32_t>{80, 90}));
  EXPECT_EQ(d.modules[0].ptx_sm, 80u);
  std::string targets;
  for (const auto& [k, v] : d.metadata)
    if (k == "target_sms") targets = v;
  EXPECT_EQ(targets, "80,86,89,90");

  options.cubin_sms = {86, 90};  // sm_80 has no cubin of its major at or below it
  EXPECT_THROW(compiler::compile_to_desc(g, options), CompileError);
  options.cubin_sms = {80, 100};  // not a target
  EXPECT_THROW(compiler::compile_to_desc(g, options), CompileError);
}

}  // namespace
}  // namespace kiln
