#include "runner_flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::tools {

int usage_error(const std::string& message) {
  std::fprintf(stderr, "kiln_runner: %s\n\n%s", message.c_str(), kUsage);
  return kExitUsage;
}

bool parse_long(const std::string& text, long min_value, long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < min_value) return false;
  *out = value;
  return true;
}

// --green_context_sms=N and --green_context_sweep=N1,N2,...|all; returns ""
// or the problem.
std::string parse_green_context_flag(const std::string& name, const std::string& value,
                                     Options* options) {
  if (name == "green_context_sms") {
    if (!parse_long(value, 0, &options->green_context_sms) ||
        options->green_context_sms > 1000000)
      return "--green_context_sms must be an integer >= 0 (0: ordinary stream), got '" + value +
             "'";
    return "";
  }
  options->green_context_sweep = value;
  options->green_context_sweep_sms.clear();
  if (value == "all") return "";
  size_t start = 0;
  while (true) {
    const size_t comma = value.find(',', start);
    const std::string item = value.substr(start, comma - start);
    long sms = 0;
    if (!parse_long(item, 1, &sms) || sms > 1000000)
      return "--green_context_sweep takes 'all' or a comma-separated list of SM counts >= 1, "
             "got '" + value + "'";
    options->green_context_sweep_sms.push_back(static_cast<unsigned>(sms));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return "";
}

// Returns an empty string on success, else the problem.
std::string parse_flags(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      options->help = true;
      continue;
    }
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos)
      return "unrecognized argument '" + arg + "' (flags are --name=value)";
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    if (name == "model_path") {
      options->model_path = value;
    } else if (name == "data_path") {
      if (value.empty()) return "--data_path: empty path";
      options->data_path = value;
    } else if (name == "method") {
      options->method = value;
    } else if (name == "inputs") {
      options->inputs = value;
    } else if (name == "expected") {
      options->expected = value;
    } else if (name == "save_outputs") {
      options->save_outputs = value;
    } else if (name == "num_runs") {
      if (!parse_long(value, 1, &options->num_runs))
        return "--num_runs must be an integer >= 1, got '" + value + "'";
    } else if (name == "warmup") {
      if (!parse_long(value, 0, &options->warmup))
        return "--warmup must be an integer >= 0, got '" + value + "'";
    } else if (name == "rtol") {
      char* end = nullptr;
      options->rtol = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(options->rtol >= 0.0))
        return "--rtol must be a number >= 0, got '" + value + "'";
    } else if (name == "seed") {
      char* end = nullptr;
      errno = 0;
      options->seed = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0)
        return "--seed must be a non-negative integer, got '" + value + "'";
      options->has_seed = true;
    } else if (name == "device_io") {
      if (value != "true" && value != "false")
        return "--device_io must be true or false, got '" + value + "'";
      options->device_io = value == "true";
    } else if (name == "cuda_events") {
      if (value != "true" && value != "false")
        return "--cuda_events must be true or false, got '" + value + "'";
      options->cuda_events = value == "true";
    } else if (name == "timing_json") {
      if (value.empty()) return "--timing_json needs a file path";
      options->timing_json = value;
    } else if (name == "use_cuda_graphs") {
      if (value != "true" && value != "false")
        return "--use_cuda_graphs must be true or false, got '" + value + "'";
      options->use_cuda_graphs = value;
    } else if (name == "green_context_sms" || name == "green_context_sweep") {
      if (std::string problem = parse_green_context_flag(name, value, options); !problem.empty())
        return problem;
    } else {
      return "unknown flag --" + name;
    }
  }
  return "";
}

}  // namespace kiln::tools
