#include "output_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>

#include "device_io.h"
#include "tensor_math.h"

namespace kiln::tools {

namespace et = executorch::runtime;

std::string tag_name(et::Tag tag) {
  char text[32];
  et::tag_to_string(tag, text, sizeof(text));
  return text;
}

bool collect_output(size_t i, const et::EValue& value, HostTensor* out) {
  if (!value.isTensor()) {
    std::printf("output %zu: %s (not a tensor)\n", i, tag_name(value.tag).c_str());
    return false;
  }
  const executorch::aten::Tensor& t = value.toTensor();
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  if (!to_dtype(t.scalar_type(), &out->dtype)) {
    std::printf("output %zu: %s tensor, a dtype kiln_runner does not handle\n", i,
                et::toString(t.scalar_type()));
    return false;
  }
  out->shape = std::move(shape);
  std::string error = copy_to_host(t, &out->data);  // host or CUDA memory
  if (!error.empty()) {
    std::printf("output %zu: cannot read it: %s\n", i, error.c_str());
    return false;
  }
  return true;
}

double output_rtol(const Options& options, engine::DType dtype) {
  const bool is_float = default_rtol(dtype) > 0.0;
  return is_float && options.rtol >= 0.0 ? options.rtol : default_rtol(dtype);
}

bool outputs_match(const Options& options, const std::vector<et::EValue>& outputs,
                   const std::vector<HostTensor>& expected) {
  if (outputs.size() != expected.size()) return false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    HostTensor out;
    if (!collect_output(i, outputs[i], &out)) return false;
    const HostTensor& ref = expected[i];
    if (out.dtype != ref.dtype || out.shape != ref.shape) return false;
    const Comparison c = compare_tensors(out, ref);
    if (c.non_finite != 0 || !(c.rel_err <= output_rtol(options, out.dtype))) return false;
  }
  return true;
}

int report_outputs(const Options& options, const std::vector<et::EValue>& outputs,
                   const std::vector<HostTensor>& expected) {
  std::vector<HostTensor> host_outputs(outputs.size());
  std::vector<bool> collected(outputs.size(), false);
  bool all_collected = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    collected[i] = collect_output(i, outputs[i], &host_outputs[i]);
    all_collected &= collected[i];
  }

  if (!options.save_outputs.empty()) {
    if (!all_collected) {
      std::fprintf(stderr, "kiln_runner: not writing %s: some outputs are not host tensors\n",
                   options.save_outputs.c_str());
      return kExitUsage;
    }
    kiln::Status status = write_tensor_file(options.save_outputs, host_outputs);
    if (!status.is_ok()) {
      std::fprintf(stderr, "kiln_runner: %s\n", status.message().c_str());
      return kExitUsage;
    }
    std::printf("outputs written to %s\n", options.save_outputs.c_str());
  }

  if (options.expected.empty()) {
    for (size_t i = 0; i < host_outputs.size(); ++i) {
      if (!collected[i]) continue;  // reported by collect_output
      const HostTensor& t = host_outputs[i];
      double sum = 0.0, abs_max = 0.0;
      for (size_t e = 0; e < static_cast<size_t>(t.numel()); ++e) {
        const double v = element_as_double(t, e);
        sum += v;
        abs_max = std::max(abs_max, std::fabs(v));
      }
      std::printf("output %zu: %s mean=%.4g abs_max=%.4g (no --expected given)\n", i,
                  describe_tensor(t.dtype, t.shape).c_str(),
                  t.numel() > 0 ? sum / static_cast<double>(t.numel()) : 0.0, abs_max);
    }
    return kExitOk;
  }

  bool pass = all_collected;
  if (expected.size() != outputs.size()) {
    std::printf("%s has %zu tensors but method '%s' returned %zu outputs: FAIL\n",
                options.expected.c_str(), expected.size(), options.method.c_str(),
                outputs.size());
    pass = false;
  }
  for (size_t i = 0; i < std::min(expected.size(), host_outputs.size()); ++i) {
    const HostTensor& out = host_outputs[i];
    const HostTensor& ref = expected[i];
    if (!collected[i]) continue;  // reported by collect_output; `pass` is already false
    const std::string out_text = describe_tensor(out.dtype, out.shape);
    if (out.dtype != ref.dtype || out.shape != ref.shape) {
      std::printf("output %zu: %s, expected %s FAIL\n", i, out_text.c_str(),
                  describe_tensor(ref.dtype, ref.shape).c_str());
      pass = false;
      continue;
    }
    const Comparison c = compare_tensors(out, ref);
    const bool is_float = default_rtol(out.dtype) > 0.0;
    const double rtol = output_rtol(options, out.dtype);
    const bool ok = c.non_finite == 0 && c.rel_err <= rtol;
    std::printf("output %zu: %s rel_err=%.2e max_abs_err=%.2e %s", i, out_text.c_str(),
                c.rel_err, c.max_abs_err, ok ? "PASS" : "FAIL");
    if (c.non_finite > 0) std::printf(" (%zu NaN/Inf values)", c.non_finite);
    if (!ok && is_float) std::printf(" (rtol %.1e)", rtol);
    if (!ok && !is_float) std::printf(" (%zu of %" PRId64 " elements differ)", c.mismatches,
                                      out.numel());
    std::printf("\n");
    pass &= ok;
  }
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? kExitOk : kExitMismatch;
}

}  // namespace kiln::tools
