#include "delegate/backend_options.h"

#include <array>
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
  kStateScope,
};

enum class Type { kBool, kInt, kString };

struct KeyInfo {
  const char* name;
  Key key;
  Type type;
  bool settable;  // false: a read-only counter
  bool at_load;   // accepted as a load-time option
  bool process;   // a process-wide setting or counter (set_option / get_option)
};

constexpr KeyInfo kKeys[] = {
    {"use_cuda_graphs", Key::kUseCudaGraphs, Type::kBool, true, true, true},
    {"use_shared_activation_scratch", Key::kUseSharedActivationScratch, Type::kBool, true, false, true},
    {"use_shared_engines", Key::kUseSharedEngines, Type::kBool, true, true, true},
    {"h2d_copies", Key::kH2dCopies, Type::kInt, false, false, true},
    {"d2h_copies", Key::kD2hCopies, Type::kInt, false, false, true},
    {"h2d_bytes", Key::kH2dBytes, Type::kInt, false, false, true},
    {"d2h_bytes", Key::kD2hBytes, Type::kInt, false, false, true},
    {"graph_launches", Key::kGraphLaunches, Type::kInt, false, false, true},
    {"graph_records", Key::kGraphRecords, Type::kInt, false, false, true},
    {"runs", Key::kRuns, Type::kInt, false, false, true},
    {"shared_engine_loads", Key::kSharedEngineLoads, Type::kInt, false, false, true},
    {"named_weight_uploads", Key::kNamedWeightUploads, Type::kInt, false, false, true},
    {"named_weight_reuses", Key::kNamedWeightReuses, Type::kInt, false, false, true},
    {"state_scope", Key::kStateScope, Type::kString, true, true, false},
};

// The key of `option` as a bounded string (the array may lack a NUL).
std::string key_text(const et::BackendOption& option) {
  return std::string(option.key, strnlen(option.key, et::kMaxOptionKeyLength));
}

// The three kinds of call that take options.
enum class Call { kSet, kGet, kLoad };

const char* call_name(Call call) {
  return call == Call::kSet ? "set_option" : call == Call::kGet ? "get_option" : "load option";
}

bool allowed_in(const KeyInfo& k, Call call) {
  switch (call) {
    case Call::kSet: return k.process && k.settable;
    case Call::kGet: return k.process;
    case Call::kLoad: return k.at_load;
  }
  return false;
}

std::string known_keys(Call call) {
  std::string list;
  for (const KeyInfo& k : kKeys) {
    if (!allowed_in(k, call)) continue;
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
template <typename Option>
Status check_keys(et::Span<Option> options, Call call, const KeyInfo** found) {
  const char* what = call_name(call);
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string name = key_text(options[i]);
    const KeyInfo* info = find_key(name);
    if (info == nullptr || !allowed_in(*info, call)) {
      if (info != nullptr && call == Call::kSet && info->process && !info->settable)
        return make_status(StatusCode::kInvalidArgument,
                           "KilnBackend %s: '%s' is a read-only counter (read it with "
                           "get_option)",
                           what, name.c_str());
      if (info != nullptr && !info->process)
        return make_status(StatusCode::kInvalidArgument,
                           "KilnBackend %s: '%s' is a load option only (give it to Module::load in a "
                           "LoadBackendOptionsMap for \"KilnBackend\")",
                           what, name.c_str());
      return make_status(StatusCode::kInvalidArgument,
                         "KilnBackend %s: unknown key '%s' (known: %s)", what, name.c_str(),
                         known_keys(call).c_str());
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

// The value of `option` holds the key's type.
Status check_type(const et::BackendOption& option, const KeyInfo& info, Call call) {
  const bool ok = info.type == Type::kBool     ? std::holds_alternative<bool>(option.value)
                  : info.type == Type::kInt    ? std::holds_alternative<int>(option.value)
                                               : std::holds_alternative<std::array<char, et::kMaxOptionValueLength>>(
                                                     option.value);
  if (ok) return Status::ok();
  const char* want = info.type == Type::kBool ? "a bool" : info.type == Type::kInt ? "an int" : "a string";
  return make_status(StatusCode::kInvalidArgument, "KilnBackend %s: '%s' expects %s, got %s",
                     call_name(call), key_text(option).c_str(), want, option_type_name(option.value));
}

Status parse_state_scope(const et::BackendOption& option, std::string* out) {
  const auto& text = std::get<std::array<char, et::kMaxOptionValueLength>>(option.value);
  return check_state_scope(text.data(), text.size(), out).with_context("KilnBackend load option 'state_scope'");
}

int saturate(uint64_t v) { return v > static_cast<uint64_t>(INT_MAX) ? INT_MAX : static_cast<int>(v); }

constexpr size_t kMaxOptionsPerCall = 64;

}  // namespace

Status check_state_scope(const char* text, size_t capacity, std::string* out) {
  const size_t n = strnlen(text, capacity);
  if (n == capacity)
    return make_status(StatusCode::kInvalidArgument,
                       "a state scope is at most %zu characters; this one has no end within %zu bytes",
                       kMaxStateScopeLength, capacity);
  if (n > kMaxStateScopeLength)
    return make_status(StatusCode::kInvalidArgument, "a state scope is at most %zu characters, got %zu",
                       kMaxStateScopeLength, n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c > 0x7e)
      return make_status(StatusCode::kInvalidArgument,
                         "the state scope has byte 0x%02x at %zu; a scope is printable ASCII", c, i);
  }
  *out = std::string(text, n);
  return Status::ok();
}

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
  KILN_RETURN_IF_ERROR(check_keys(options, Call::kSet, keys));
  for (size_t i = 0; i < options.size(); ++i) KILN_RETURN_IF_ERROR(check_type(options[i], *keys[i], Call::kSet));
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
  KILN_RETURN_IF_ERROR(check_keys(options, Call::kLoad, keys));
  for (size_t i = 0; i < options.size(); ++i) KILN_RETURN_IF_ERROR(check_type(options[i], *keys[i], Call::kLoad));
  LoadOptions next;
  for (size_t i = 0; i < options.size(); ++i) {
    switch (keys[i]->key) {
      case Key::kUseCudaGraphs: next.use_cuda_graphs = std::get<bool>(options[i].value); break;
      case Key::kUseSharedEngines: next.use_shared_engines = std::get<bool>(options[i].value); break;
      case Key::kStateScope: KILN_RETURN_IF_ERROR(parse_state_scope(options[i], &next.state_scope)); break;
      default: break;
    }
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
  KILN_RETURN_IF_ERROR(check_keys(options, Call::kGet, keys));
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
      case Key::kStateScope: break;  // load-only: check_keys refused it
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
