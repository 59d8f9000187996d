// Which code of a kernel module a GPU runs (runtime/steps/kernel_code_choice.h),
// without a GPU: the exact cubin, else one of the same major and an older
// minor, else the PTX when it is not newer than the GPU, else a refusal that
// names the GPU's SM and everything the module carries. The load itself and
// the JIT line are checked on the GPU (tests/gpu/sm_targets_test.py).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/steps/kernel_code_choice.h"

namespace kiln::runtime {
namespace {

engine::KernelModule module_with(const std::vector<uint32_t>& sms, uint32_t ptx_sm) {
  engine::KernelModule m;
  m.name = "kiln_kernels";
  for (uint32_t sm : sms) {
    engine::CubinImage c;
    c.sm = sm;
    c.image = {uint8_t(sm), 1, 2, 3};  // the choice reads only the SM
    m.cubins.push_back(c);
  }
  if (ptx_sm != 0) {
    m.ptx = ".version 9.0\n.target sm_" + std::to_string(ptx_sm) + "\n";
    m.ptx_sm = ptx_sm;
  }
  return m;
}

uint32_t chosen_arch(const engine::KernelModule& m, uint32_t sm, bool* from_ptx = nullptr) {
  Result<KernelCode> code = choose_kernel_code(m, sm);
  EXPECT_TRUE(code.is_ok()) << code.status().to_string();
  if (!code.is_ok()) return 0;
  if (from_ptx) *from_ptx = code->from_ptx;
  return code->arch;
}

TEST(KernelCodeChoice, DefaultTargetsGiveEveryGpuItsOwnCubin) {
  const std::vector<uint32_t> sms = {80, 86, 87, 89, 90, 100, 110, 120};
  const engine::KernelModule m = module_with(sms, 80);
  for (uint32_t sm : sms) {
    bool ptx = true;
    EXPECT_EQ(chosen_arch(m, sm, &ptx), sm);
    EXPECT_FALSE(ptx);
    Result<KernelCode> code = choose_kernel_code(m, sm);
    EXPECT_EQ(code->which, "cubin sm_" + std::to_string(sm));
    EXPECT_EQ(static_cast<const uint8_t*>(code->image)[0], uint8_t(sm));
  }
  // Same major, newer minor: the newest older cubin of that major (B300, GB10).
  EXPECT_EQ(chosen_arch(m, 103), 100u);
  EXPECT_EQ(chosen_arch(m, 121), 120u);
  // A newer major than any cubin: the compute_80 PTX, JIT-compiled.
  bool ptx = false;
  EXPECT_EQ(chosen_arch(m, 130, &ptx), 80u);
  EXPECT_TRUE(ptx);
  EXPECT_EQ(choose_kernel_code(m, 130)->which, "PTX compute_80");
  EXPECT_EQ(std::string(static_cast<const char*>(choose_kernel_code(m, 130)->image)), m.ptx);
}

TEST(KernelCodeChoice, OneCubinPerMajorCoversTheDefaultTargets) {
  // What kiln.compile's default targets carry: cubins for sm_80, sm_90,
  // sm_100, sm_110, sm_120 and PTX compute_80. The minors of Ampere/Ada run
  // the sm_80 cubin (machine code, no JIT); every other SM its own.
  const engine::KernelModule m = module_with({80, 90, 100, 110, 120}, 80);
  const std::vector<std::pair<uint32_t, uint32_t>> expected = {
      {80, 80}, {86, 80}, {87, 80}, {89, 80}, {90, 90}, {100, 100}, {103, 100}, {110, 110}, {120, 120}, {121, 120}};
  for (const auto& [gpu, cubin] : expected) {
    bool ptx = true;
    EXPECT_EQ(chosen_arch(m, gpu, &ptx), cubin) << "sm_" << gpu;
    EXPECT_FALSE(ptx) << "sm_" << gpu;
    EXPECT_EQ(choose_kernel_code(m, gpu)->which, "cubin sm_" + std::to_string(cubin));
  }
  // An SM older than every cubin of its major is never given a newer one.
  EXPECT_FALSE(choose_kernel_code(module_with({86, 90}, 0), 80).is_ok());
}

TEST(KernelCodeChoice, OrderOfCubinsDoesNotMatter) {
  const engine::KernelModule m = module_with({87, 80, 86}, 0);
  EXPECT_EQ(chosen_arch(m, 86), 86u);
  EXPECT_EQ(chosen_arch(m, 89), 87u);
  EXPECT_EQ(chosen_arch(m, 80), 80u);
}

TEST(KernelCodeChoice, OnlyPtxForAnOlderSmIsJitCompiled) {
  // What an sm_80-only export gives an H200: its sm_80 cubin is another major.
  bool ptx = false;
  EXPECT_EQ(chosen_arch(module_with({80}, 80), 90, &ptx), 80u);
  EXPECT_TRUE(ptx);
  EXPECT_EQ(chosen_arch(module_with({}, 80), 90, &ptx), 80u);
  EXPECT_TRUE(ptx);
}

TEST(KernelCodeChoice, RefusalNamesTheGpuAndWhatTheEngineCarries) {
  Result<KernelCode> code = choose_kernel_code(module_with({100, 120}, 100), 90);
  ASSERT_FALSE(code.is_ok());
  EXPECT_EQ(code.status().code(), StatusCode::kIncompatible);
  const std::string text = code.status().to_string();
  for (const char* part : {"kiln_kernels", "this GPU is sm_90", "cubins for sm_100, sm_120", "PTX for compute_100",
                           "target_sms including 90"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in: " << text;

  // A cubin of the same major but a newer minor does not run either.
  code = choose_kernel_code(module_with({89}, 0), 86);
  ASSERT_FALSE(code.is_ok());
  EXPECT_NE(code.status().to_string().find("cubins for sm_89 and no PTX"), std::string::npos)
      << code.status().to_string();
}

}  // namespace
}  // namespace kiln::runtime
