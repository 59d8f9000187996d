#include "delegate/backend_options.h"

#include <climits>
#include <cstring>
#include <variant>

namespace kiln::delegate {

namespace et = executorch::runtime;

namespace {

enum class Key {
  kUseCudaGraphs,
  kUseSharedActivationScratch,
  kUseSharedEngines,
  kH2dCopies,
  kD2hCopies,
  kH2dBytes,
  kD2hBytes,
  kGraphLaunches,
  kGraphRecords,
  kRuns,
  kSharedEngineLoads,
  kNamedWeightUploads,
  kNamedWeightReuses,
};

struct KeyInfo {
  const char* name;
  Key key;
  bool settable;  // false: a read-only counter
  bool at_load;   // accepted as a load-time option
};

constexpr KeyInfo kKeys[] = {
    {"use_cuda_graphs", Key::kUseCudaGraphs, true, true},
    {"use_shared_activation_scratch", Key::kUseSharedActivationScratch, true, false},
    {"use_shared_engines", Key::kUseSharedEngines, true, true},
    {"h2d_copies", Key::kH2dCopies, false, false},
    {"d2h_copies", Key::kD2hCopies, false, false},
    {"h2d_bytes", Key::kH2dBytes, false, false},
    {"d2h_bytes", Key::kD2hBytes, false, false},
    {"graph_launches", Key::kGraphLaunches, false, false},
    {"graph_records", Key::kGraphRecords, false, false},
    {"runs", Key::kRuns, false, false},
    {"shared_engine_loads", Key::kSharedEngineLoads, false, false},
    {"named_weight_uploads", Key::kNamedWeightUploads, false, false},
    {"named_weight_reuses", Key::kNamedWeightReuses, false, false},
};

// The key of `option` as a bounded string (the array may lack a NUL).
std::string key_text(const et::BackendOption& option) {
  return std::string(option.key, strnlen(option.key, et::kMaxOptionKeyLength));
}

std::string known_keys(bool settable_only, bool load_only) {
  std::string list;
  for (const KeyInfo& k : kKeys) {
    if ((settable_only && !k.settable) || (load_only && !k.at_load)) continue;
    list += list.empty() ? "" : ", ";
    list += k.name;
  }
  return list;
}

const KeyInfo* find_key(const std::string& name) {
  for (const KeyInfo& k : kKeys)
    if (name == k.name) return &k;
  return nullptr;
}

// Shared checks: every key known for this kind of call, no key twice.
// `what` is "set_option", "get_option" or "load option".
template <typename Option>
Status check_keys(et::Span<Option> options, const char* what, bool settable_only,
                  bool load_only, const KeyInfo** found) {
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string name = key_text(options[i]);
    const KeyInfo* info = find_key(name);
    const bool allowed =
        info != nullptr && (!settable_only || info->settable) && (!load_only || info->at_load);
    if (!allowed) {
      if (info != nullptr && settable_only && !info->settable)
        return make_status(StatusCode::kInvalidArgument,
                           "KilnBackend %s: '%s' is a read-only counter (read it with "
                           "get_option)",
                           what, name.c_str());
      return make_status(StatusCode::kInvalidArgument,
                         "KilnBackend %s: unknown key '%s' (known: %s)", what, name.c_str(),
                         known_keys(settable_only, load_only).c_str());
    }
    for (size_t j = 0; j < i; ++j)
      if (key_text(options[j]) == name)
        return make_status(StatusCode::kInvalidArgument,
                           "KilnBackend %s: key '%s' is given twice (entries %zu and %zu)", what,
                           name.c_str(), j, i);
    found[i] = info;
  }
  return Status::ok();
}

Status check_bool(const et::BackendOption& option, const char* what) {
  if (std::holds_alternative<bool>(option.value)) return Status::ok();
  return make_status(StatusCode::kInvalidArgument,
                     "KilnBackend %s: '%s' expects a bool, got %s", what,
                     key_text(option).c_str(), option_type_name(option.value));
}

int saturate(uint64_t v) { return v > static_cast<uint64_t>(INT_MAX) ? INT_MAX : static_cast<int>(v); }

constexpr size_t kMaxOptionsPerCall = 64;

}  // namespace

const char* option_type_name(const et::OptionValue& value) {
  if (std::holds_alternative<bool>(value)) return "bool";
  if (std::holds_alternative<int>(value)) return "int";
  return "string";
}

Status parse_set_options(et::Span<const et::BackendOption> options, const ProcessOptions& current,
                         ProcessOptions* out) {
  if (options.size() > kMaxOptionsPerCall)
    return make_status(StatusCode::kInvalidArgument,
                       "KilnBackend set_option: %zu options given; at most %zu", options.size(),
                       kMaxOptionsPerCall);
  const KeyInfo* keys[kMaxOptionsPerCall] = {};
  KILN_RETURN_IF_ERROR(check_keys(options, "set_option", true, false, keys));
  for (size_t i = 0; i < options.size(); ++i)
    KILN_RETURN_IF_ERROR(check_bool(options[i], "set_option"));
  // Everything is valid: apply all of it.
  ProcessOptions next = current;
  for (size_t i = 0; i < options.size(); ++i) {
    const bool v = std::get<bool>(options[i].value);
    switch (keys[i]->key) {
      case Key::kUseCudaGraphs: next.use_cuda_graphs = v; break;
      case Key::kUseSharedActivationScratch: next.use_shared_activation_scratch = v; break;
      case Key::kUseSharedEngines: next.use_shared_engines = v; break;
      default: break;
    }
  }
  *out = next;
  return Status::ok();
}

Status parse_load_options(et::Span<const et::BackendOption> options, LoadOptions* out) {
  if (options.size() > kMaxOptionsPerCall)
    return make_status(StatusCode::kInvalidArgument,
                       "KilnBackend load option: %zu options given; at most %zu", options.size(),
                       kMaxOptionsPerCall);
  const KeyInfo* keys[kMaxOptionsPerCall] = {};
  KILN_RETURN_IF_ERROR(check_keys(options, "load option", true, true, keys));
  for (size_t i = 0; i < options.size(); ++i)
    KILN_RETURN_IF_ERROR(check_bool(options[i], "load option"));
  LoadOptions next;
  for (size_t i = 0; i < options.size(); ++i) {
    const bool v = std::get<bool>(options[i].value);
    if (keys[i]->key == Key::kUseCudaGraphs) next.use_cuda_graphs = v;
    if (keys[i]->key == Key::kUseSharedEngines) next.use_shared_engines = v;
  }
  *out = next;
  return Status::ok();
}

Status fill_get_options(et::Span<et::BackendOption> options, const ProcessOptions& current,
                        const CounterValues& counters) {
  if (options.size() > kMaxOptionsPerCall)
    return make_status(StatusCode::kInvalidArgument,
                       "KilnBackend get_option: %zu options asked for; at most %zu",
                       options.size(), kMaxOptionsPerCall);
  const KeyInfo* keys[kMaxOptionsPerCall] = {};
  KILN_RETURN_IF_ERROR(check_keys(options, "get_option", false, false, keys));
  for (size_t i = 0; i < options.size(); ++i) {
    et::OptionValue& value = options[i].value;
    switch (keys[i]->key) {
      case Key::kUseCudaGraphs: value = current.use_cuda_graphs; break;
      case Key::kUseSharedActivationScratch: value = current.use_shared_activation_scratch; break;
      case Key::kUseSharedEngines: value = current.use_shared_engines; break;
      case Key::kH2dCopies: value = saturate(counters.h2d_copies); break;
      case Key::kD2hCopies: value = saturate(counters.d2h_copies); break;
      case Key::kH2dBytes: value = saturate(counters.h2d_bytes); break;
      case Key::kD2hBytes: value = saturate(counters.d2h_bytes); break;
      case Key::kGraphLaunches: value = saturate(counters.graph_launches); break;
      case Key::kGraphRecords: value = saturate(counters.graph_records); break;
      case Key::kRuns: value = saturate(counters.runs); break;
      case Key::kSharedEngineLoads: value = saturate(counters.shared_engine_loads); break;
      case Key::kNamedWeightUploads: value = saturate(counters.named_weight_uploads); break;
      case Key::kNamedWeightReuses: value = saturate(counters.named_weight_reuses); break;
    }
  }
  return Status::ok();
}

Status resolve_use_cuda_graphs(const LoadOptions& load, const std::string* metadata,
                               bool process_default, bool* use, GraphsSource* source) {
  if (load.use_cuda_graphs.has_value()) {
    *use = *load.use_cuda_graphs;
    *source = GraphsSource::kLoadOption;
    return Status::ok();
  }
  if (metadata != nullptr) {
    if (*metadata != "true" && *metadata != "false")
      return make_status(StatusCode::kCorruptData,
                         "engine metadata use_cuda_graphs is '%s'; expected 'true' or 'false'",
                         metadata->c_str());
    *use = *metadata == "true";
    *source = GraphsSource::kEngineMetadata;
    return Status::ok();
  }
  *use = process_default;
  *source = GraphsSource::kProcessDefault;
  return Status::ok();
}

const char* graphs_source_name(GraphsSource source) {
  switch (source) {
    case GraphsSource::kLoadOption: return "load option";
    case GraphsSource::kEngineMetadata: return "engine metadata";
    case GraphsSource::kProcessDefault: return "process default";
  }
  return "?";
}

}  // namespace kiln::delegate
