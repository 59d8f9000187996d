#include "host_kernel.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ops/elementwise_kernel.h"
#include "passes/dtype_convert.h"

#ifndef KILN_HOST_CXX
#error "KILN_HOST_CXX (the host C++ compiler) must be defined by the build"
#endif

namespace kiln::testing {

void run_host_kernel(const std::string& src, const std::string& fn, const std::string& tag, void** args,
                     unsigned grid, unsigned block, const std::string& shim_header) {
  const std::string full = host_prelude() + src + "\nextern \"C\" void kiln_test_launch(void** a, unsigned g, "
                           "unsigned b) {\n  kiln_shim_launch(&" + fn + ", a, g, b);\n}\n";
  void* lib = build_host_module(full, tag, shim_header);
  if (lib == nullptr) return;  // build_host_module reported the failure
  auto launch = reinterpret_cast<void (*)(void**, unsigned, unsigned)>(dlsym(lib, "kiln_test_launch"));
  if (launch == nullptr) {
    ADD_FAILURE() << "kiln_test_launch missing from the host module of " << fn;
  } else {
    launch(args, grid, block);
  }
  dlclose(lib);
}

void* build_host_module(const std::string& source, const std::string& tag, const std::string& shim_header) {
  namespace fs = std::filesystem;
  // A fresh path per module: dlopen hands back the library already loaded
  // from the same path, so a second module under one tag would run the first.
  static int count = 0;
  fs::path dir = fs::temp_directory_path() /
                 ("kiln_host_" + std::to_string(::getpid()) + "_" + tag + "_" + std::to_string(count++));
  fs::create_directories(dir);
  fs::path cpp = dir / "kernel.cpp", so = dir / "kernel.so", log = dir / "build.log";
  std::ofstream(cpp) << "#include \"" << shim_header << "\"\n" << source;
  std::string cmd = std::string(KILN_HOST_CXX) + " -std=c++17 -O1 -fPIC -shared -fno-strict-aliasing -w -o " +
                    so.string() + " " + cpp.string() + " > " + log.string() + " 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    ADD_FAILURE() << "host compile failed: " << cmd << "\n" << text.str() << "\nsource:\n" << source;
    return nullptr;
  }
  void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(handle, nullptr) << dlerror();
  std::error_code ignored;
  fs::remove_all(dir, ignored);  // the mapping outlives the file
  return handle;
}

BlockLaunch block_launcher(const std::string& source, const std::string& fn, const std::string& tag,
                           const std::string& block_shim_header, const std::string& order) {
  const std::string wrapped = host_prelude() + source +
                              "\nextern \"C\" void kiln_test_launch(void** args, unsigned grid, unsigned block) {\n"
                              "  kiln_shim_launch_blocks(&" + fn + ", args, grid, block, " + order + ");\n}\n";
  void* lib = build_host_module(wrapped, tag, block_shim_header);
  return lib == nullptr ? nullptr : reinterpret_cast<BlockLaunch>(dlsym(lib, "kiln_test_launch"));
}

std::string host_prelude() {
  std::istringstream in(ops::pointwise_prelude());
  std::string line, block, out;
  int depth = 0;
  while (std::getline(in, line)) {
    if (depth == 0 && line.rfind("__device__", 0) != 0) {
      out += line + "\n";
      continue;
    }
    block += line + "\n";
    for (char ch : line) depth += ch == '{' ? 1 : ch == '}' ? -1 : 0;
    if (depth == 0) {
      if (block.find("asm(") == std::string::npos) out += block;
      block.clear();
    }
  }
  return out;
}

double round_to(engine::DType d, double v) {
  if (d == engine::DType::kFloat16) return passes::half_to_float(passes::float_to_half(static_cast<float>(v)));
  if (d == engine::DType::kBFloat16)
    return passes::bfloat16_to_float(passes::float_to_bfloat16(static_cast<float>(v)));
  if (d == engine::DType::kFloat32) return static_cast<float>(v);
  return v;
}

double read_elem(engine::DType d, const std::vector<uint8_t>& bytes, size_t i) {
  if (d == engine::DType::kFloat32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return d == engine::DType::kFloat16 ? passes::half_to_float(h) : passes::bfloat16_to_float(h);
}

void write_elem(engine::DType d, std::vector<uint8_t>& bytes, size_t i, float v) {
  if (d == engine::DType::kFloat32) {
    std::memcpy(&bytes[i * 4], &v, 4);
    return;
  }
  uint16_t h = d == engine::DType::kFloat16 ? passes::float_to_half(v) : passes::float_to_bfloat16(v);
  std::memcpy(&bytes[i * 2], &h, 2);
}

std::vector<uint8_t> random_elems(engine::DType d, int64_t count, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint8_t> b(static_cast<size_t>(count) * engine::dtype_size(d));
  for (int64_t i = 0; i < count; ++i) write_elem(d, b, static_cast<size_t>(i), dist(rng));
  return b;
}

}  // namespace kiln::testing
