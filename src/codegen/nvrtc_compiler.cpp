#include "codegen/nvrtc_compiler.h"

#include <nvrtc.h>

#include <algorithm>
#include <memory>

#include "ir/graph.h"

namespace kiln::codegen {
namespace {

void check(nvrtcResult result, const char* what) {
  if (result != NVRTC_SUCCESS) throw CompileError(std::string(what) + ": " + nvrtcGetErrorString(result));
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    nvrtcDestroyProgram(p);
    delete p;
  }
};
using Program = std::unique_ptr<nvrtcProgram, ProgramDeleter>;

Program compile(const std::string& name, const std::string& source, const std::string& arch) {
  Program program(new nvrtcProgram(nullptr));
  check(nvrtcCreateProgram(program.get(), source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  std::string arch_flag = "--gpu-architecture=" + arch;
  // No fast-math: results must match PyTorch's to float32 rounding.
  const char* options[] = {arch_flag.c_str(), "--std=c++17", "-default-device"};
  nvrtcResult result = nvrtcCompileProgram(*program, 3, options);
  if (result != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(*program, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nvrtcGetProgramLog(*program, log.data());
    throw CompileError("NVRTC failed to compile module '" + name + "' for " + arch + ": " +
                       nvrtcGetErrorString(result) + "\n" + log);
  }
  return program;
}

}  // namespace

engine::KernelModule compile_module(const std::string& name, const std::string& source,
                                    const std::vector<uint32_t>& target_sms, bool emit_ptx) {
  if (target_sms.empty()) throw CompileError("no target SMs given");
  engine::KernelModule module;
  module.name = name;
  module.source = source;
  for (uint32_t sm : target_sms) {
    Program program = compile(name, source, "sm_" + std::to_string(sm));
    size_t size = 0;
    check(nvrtcGetCUBINSize(*program, &size), "nvrtcGetCUBINSize");
    engine::CubinImage image;
    image.sm = sm;
    image.image.resize(size);
    check(nvrtcGetCUBIN(*program, reinterpret_cast<char*>(image.image.data())), "nvrtcGetCUBIN");
    module.cubins.push_back(std::move(image));
  }
  if (emit_ptx) {
    uint32_t newest = *std::max_element(target_sms.begin(), target_sms.end());
    Program program = compile(name, source, "compute_" + std::to_string(newest));
    size_t size = 0;
    check(nvrtcGetPTXSize(*program, &size), "nvrtcGetPTXSize");
    std::string ptx(size, '\0');
    check(nvrtcGetPTX(*program, ptx.data()), "nvrtcGetPTX");
    while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    module.ptx = std::move(ptx);
    module.ptx_sm = newest;
  }
  return module;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace kiln::codegen
