// KilnBackend's options: which keys exist, their types, and the parsing of
// ExecuTorch BackendOption lists into plain structs. No CUDA here, so all of
// it is tested without a GPU (tests/cpp/backend_options_test.cpp).
//
// Process-wide options (set_option / get_option, executorch::runtime::
// set_option("KilnBackend", ...)):
//   use_cuda_graphs               bool  default false  engines loaded later
//   use_shared_activation_scratch bool  default false  contexts created later
//   use_shared_engines            bool  default true   engines loaded later
// Load-time options (Module::load(LoadBackendOptionsMap) for "KilnBackend";
// they win over the process defaults for that load):
//   use_cuda_graphs     bool
//   use_shared_engines  bool
//   state_scope         string  default ""  the scope of the load's mutable states (a KV cache):
//                       loads of one model in one scope share one cache on a GPU; loads in
//                       different scopes (two concurrent generations) each get their own.
//                       At most 255 printable ASCII characters. Weights are shared regardless.
// Read-only counters for get_option (int, totals over every handle in the
// process, saturating at INT_MAX): h2d_copies, d2h_copies, h2d_bytes and
// d2h_bytes (what those copies moved: a decode step moves its token and
// position in and one token out, never the KV cache), graph_launches,
// graph_records, runs, shared_engine_loads, named_weight_uploads (named
// weights copied to a GPU), named_weight_reuses (named weights an engine
// found already on its GPU: uploaded once, shared by methods and loads).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/core/span.h>

#include "common/status.h"

namespace kiln::delegate {

struct ProcessOptions {
  bool use_cuda_graphs = false;
  bool use_shared_activation_scratch = false;
  bool use_shared_engines = true;
};

struct LoadOptions {
  std::optional<bool> use_cuda_graphs;
  std::optional<bool> use_shared_engines;
  std::string state_scope;  // "" : the default scope
};

// Counter values get_option reports.
struct CounterValues {
  uint64_t h2d_copies = 0;
  uint64_t d2h_copies = 0;
  uint64_t h2d_bytes = 0;
  uint64_t d2h_bytes = 0;
  uint64_t graph_launches = 0;
  uint64_t graph_records = 0;
  uint64_t runs = 0;
  uint64_t shared_engine_loads = 0;
  uint64_t named_weight_uploads = 0;
  uint64_t named_weight_reuses = 0;
};

// Validates every entry of `options` (known key, bool value, no key twice)
// and only then applies them to a copy of `current`, returned in `*out`; on
// failure `*out` is untouched. kInvalidArgument names the key and the
// expected vs. given type.
Status parse_set_options(executorch::runtime::Span<const executorch::runtime::BackendOption> options,
                         const ProcessOptions& current, ProcessOptions* out);

// The same for load-time options (scratch sharing is process-wide; state_scope is load-only).
Status parse_load_options(
    executorch::runtime::Span<const executorch::runtime::BackendOption> options,
    LoadOptions* out);

// The longest state scope: what a BackendOption's string value holds.
constexpr size_t kMaxStateScopeLength = executorch::runtime::kMaxOptionValueLength - 1;

// Checks a state scope's text, at most `capacity` bytes at `text` (NUL-terminated within them,
// at most kMaxStateScopeLength characters, printable ASCII: it appears in log lines), and
// copies it to *out. "" is the default scope. kInvalidArgument names the problem.
Status check_state_scope(const char* text, size_t capacity, std::string* out);

// Fills the value of each requested key (settings as bool, counters as int).
// Unknown or duplicated keys fail before anything is written.
Status fill_get_options(executorch::runtime::Span<executorch::runtime::BackendOption> options,
                        const ProcessOptions& current, const CounterValues& counters);

// Where the use_cuda_graphs decision came from, for the load log line.
enum class GraphsSource { kLoadOption, kEngineMetadata, kProcessDefault };

// Precedence: load option > the engine's metadata ("true"/"false"; absent
// means no preference) > the process default. A metadata value other than
// "true"/"false" is a kCorruptData error naming it.
Status resolve_use_cuda_graphs(const LoadOptions& load, const std::string* metadata,
                               bool process_default, bool* use, GraphsSource* source);

const char* graphs_source_name(GraphsSource source);

// "bool", "int" or "string": the type an option value holds.
const char* option_type_name(const executorch::runtime::OptionValue& value);

}  // namespace kiln::delegate
