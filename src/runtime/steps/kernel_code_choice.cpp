#include "runtime/steps/kernel_code_choice.h"

namespace kiln::runtime {

std::string describe_kernel_code(const engine::KernelModule& m) {
  std::string text;
  for (const auto& cubin : m.cubins) text += (text.empty() ? "cubins for sm_" : ", sm_") + std::to_string(cubin.sm);
  if (text.empty()) text = "no cubin";
  text += m.ptx.empty() ? " and no PTX" : " and PTX for compute_" + std::to_string(m.ptx_sm);
  return text;
}

Result<KernelCode> choose_kernel_code(const engine::KernelModule& m, uint32_t sm) {
  KernelCode code;
  for (const auto& cubin : m.cubins) {
    const bool fits = cubin.sm == sm || (cubin.sm / 10 == sm / 10 && cubin.sm < sm);
    if (!fits || code.arch == sm || (cubin.sm != sm && cubin.sm <= code.arch)) continue;
    code.image = cubin.image.data();
    code.arch = cubin.sm;
  }
  if (code.image != nullptr) {
    code.which = "cubin sm_" + std::to_string(code.arch);
    return code;
  }
  if (!m.ptx.empty() && m.ptx_sm <= sm) {
    code.image = m.ptx.c_str();  // NUL-terminated, as the loader requires
    code.from_ptx = true;
    code.arch = m.ptx_sm;
    code.which = "PTX compute_" + std::to_string(m.ptx_sm);
    return code;
  }
  return make_status(StatusCode::kIncompatible,
                     "engine module '%s' has no code this GPU can run: this GPU is sm_%u; the engine carries %s "
                     "(a cubin must be for sm_%u or an older minor of sm_%ux, PTX for compute_%u or older); "
                     "export with target_sms including %u",
                     m.name.c_str(), sm, describe_kernel_code(m).c_str(), sm, sm / 10, sm, sm);
}

}  // namespace kiln::runtime
