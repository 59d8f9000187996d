// KilnBackend options without a GPU: the parsers in delegate/backend_options.h
// and the registered backend's set_option/get_option through ExecuTorch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/runtime.h>

#include "delegate/backend_options.h"

namespace {

namespace et = executorch::runtime;
using kiln::StatusCode;
using kiln::delegate::CounterValues;
using kiln::delegate::GraphsSource;
using kiln::delegate::LoadOptions;
using kiln::delegate::ProcessOptions;

template <typename T>
et::BackendOption make(const char* key, T value) {
  et::BackendOption option;
  std::snprintf(option.key, sizeof(option.key), "%s", key);
  option.value = value;
  return option;
}

et::BackendOption make_string(const char* key, const char* value) {
  et::BackendOption option;
  std::snprintf(option.key, sizeof(option.key), "%s", key);
  std::array<char, et::kMaxOptionValueLength> text{};
  std::snprintf(text.data(), text.size(), "%s", value);
  option.value = text;
  return option;
}

et::Span<const et::BackendOption> view(const std::vector<et::BackendOption>& v) {
  return et::Span<const et::BackendOption>(v.data(), v.size());
}

TEST(BackendOptions, DefaultsAreGraphsOffSharingOnScratchOff) {
  ProcessOptions defaults;
  EXPECT_FALSE(defaults.use_cuda_graphs);
  EXPECT_TRUE(defaults.use_shared_engines);
  EXPECT_FALSE(defaults.use_shared_activation_scratch);
}

TEST(BackendOptions, SetAppliesEveryKey) {
  std::vector<et::BackendOption> v = {make("use_cuda_graphs", true),
                                      make("use_shared_activation_scratch", true),
                                      make("use_shared_engines", false)};
  ProcessOptions out;
  ASSERT_TRUE(kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &out).is_ok());
  EXPECT_TRUE(out.use_cuda_graphs);
  EXPECT_TRUE(out.use_shared_activation_scratch);
  EXPECT_FALSE(out.use_shared_engines);
}

TEST(BackendOptions, SetKeepsUnmentionedKeys) {
  ProcessOptions current;
  current.use_cuda_graphs = true;
  std::vector<et::BackendOption> v = {make("use_shared_engines", false)};
  ProcessOptions out;
  ASSERT_TRUE(kiln::delegate::parse_set_options(view(v), current, &out).is_ok());
  EXPECT_TRUE(out.use_cuda_graphs);
  EXPECT_FALSE(out.use_shared_engines);
}

TEST(BackendOptions, UnknownKeyIsNamedAndNothingApplied) {
  // A valid key first: the bad second one must stop the whole list.
  std::vector<et::BackendOption> v = {make("use_cuda_graphs", true),
                                      make("use_cuda_graph", true)};
  ProcessOptions out;
  out.use_shared_engines = false;  // sentinel: must stay as is
  kiln::Status s = kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown key 'use_cuda_graph'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("use_shared_activation_scratch"), std::string::npos);
  EXPECT_FALSE(out.use_cuda_graphs);
  EXPECT_FALSE(out.use_shared_engines);
}

TEST(BackendOptions, WrongTypeNamesExpectedAndGot) {
  for (const auto& option : {make("use_cuda_graphs", 1), make_string("use_cuda_graphs", "true")}) {
    std::vector<et::BackendOption> v = {option};
    ProcessOptions out;
    kiln::Status s = kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &out);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("'use_cuda_graphs' expects a bool, got "), std::string::npos)
        << s.message();
    EXPECT_FALSE(out.use_cuda_graphs);
  }
  std::vector<et::BackendOption> v = {make("use_shared_engines", 0)};
  ProcessOptions out;
  kiln::Status s = kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &out);
  EXPECT_NE(s.message().find("expects a bool, got int"), std::string::npos) << s.message();
}

TEST(BackendOptions, DuplicateKeyIsRefused) {
  std::vector<et::BackendOption> v = {make("use_cuda_graphs", true),
                                      make("use_cuda_graphs", false)};
  ProcessOptions out;
  kiln::Status s = kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'use_cuda_graphs' is given twice"), std::string::npos)
      << s.message();
}

TEST(BackendOptions, CountersCannotBeSet) {
  std::vector<et::BackendOption> v = {make("h2d_copies", 0)};
  ProcessOptions out;
  kiln::Status s = kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("read-only counter"), std::string::npos) << s.message();
}

TEST(BackendOptions, LoadOptionsTakeTwoKeys) {
  std::vector<et::BackendOption> v = {make("use_cuda_graphs", false),
                                      make("use_shared_engines", false)};
  LoadOptions out;
  ASSERT_TRUE(kiln::delegate::parse_load_options(view(v), &out).is_ok());
  ASSERT_TRUE(out.use_cuda_graphs.has_value());
  EXPECT_FALSE(*out.use_cuda_graphs);
  ASSERT_TRUE(out.use_shared_engines.has_value());
  EXPECT_FALSE(*out.use_shared_engines);

  LoadOptions empty;
  ASSERT_TRUE(kiln::delegate::parse_load_options(view({}), &empty).is_ok());
  EXPECT_FALSE(empty.use_cuda_graphs.has_value());

  // Scratch sharing is process-wide only.
  std::vector<et::BackendOption> scratch = {make("use_shared_activation_scratch", true)};
  kiln::Status s = kiln::delegate::parse_load_options(view(scratch), &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("load option: unknown key 'use_shared_activation_scratch'"),
            std::string::npos)
      << s.message();
}

TEST(BackendOptions, StateScopeIsALoadOptionString) {
  LoadOptions out;
  std::vector<et::BackendOption> v = {make_string("state_scope", "session-2")};
  ASSERT_TRUE(kiln::delegate::parse_load_options(view(v), &out).is_ok());
  EXPECT_EQ(out.state_scope, "session-2");
  LoadOptions none;
  ASSERT_TRUE(kiln::delegate::parse_load_options(view({}), &none).is_ok());
  EXPECT_EQ(none.state_scope, "");  // the default scope

  // A bool where a string belongs.
  std::vector<et::BackendOption> as_bool = {make("state_scope", true)};
  kiln::Status s = kiln::delegate::parse_load_options(view(as_bool), &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'state_scope' expects a string, got bool"), std::string::npos) << s.message();
  // A string where a bool belongs.
  std::vector<et::BackendOption> graphs_text = {make_string("use_cuda_graphs", "true")};
  s = kiln::delegate::parse_load_options(view(graphs_text), &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'use_cuda_graphs' expects a bool, got string"), std::string::npos) << s.message();

  // 256 bytes with no NUL, and a control character: refused, naming the problem.
  et::BackendOption full = make_string("state_scope", "");
  std::get<std::array<char, et::kMaxOptionValueLength>>(full.value).fill('a');
  s = kiln::delegate::parse_load_options(view({full}), &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("load option 'state_scope': a state scope is at most 255 characters; this one has no end within 256 bytes"), std::string::npos) << s.message();
  s = kiln::delegate::parse_load_options(view({make_string("state_scope", "a\nb")}), &out);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("byte 0x0a at 1"), std::string::npos) << s.message();
  // 255 characters is the longest scope.
  et::BackendOption longest = make_string("state_scope", std::string(255, 'z').c_str());
  ASSERT_TRUE(kiln::delegate::parse_load_options(view({longest}), &out).is_ok());
  EXPECT_EQ(out.state_scope.size(), 255u);

  // Not a process-wide setting: set_option and get_option refuse it by name.
  ProcessOptions process;
  s = kiln::delegate::parse_set_options(view(v), ProcessOptions{}, &process);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("set_option: 'state_scope' is a load option only"), std::string::npos)
      << s.message();
  std::vector<et::BackendOption> get = {make_string("state_scope", "")};
  s = kiln::delegate::fill_get_options(et::Span<et::BackendOption>(get.data(), get.size()), process,
                                       CounterValues{});
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("get_option: 'state_scope' is a load option only"), std::string::npos)
      << s.message();
}

TEST(BackendOptions, GetFillsSettingsAndCounters) {
  std::vector<et::BackendOption> v = {make("use_shared_engines", false),
                                      make("h2d_copies", false), make("graph_launches", false)};
  ProcessOptions current;
  CounterValues counters;
  counters.h2d_copies = 7;
  counters.graph_launches = 5000000000ull;  // saturates
  ASSERT_TRUE(kiln::delegate::fill_get_options(et::Span<et::BackendOption>(v.data(), v.size()),
                                               current, counters)
                  .is_ok());
  EXPECT_EQ(std::get<bool>(v[0].value), true);
  EXPECT_EQ(std::get<int>(v[1].value), 7);
  EXPECT_EQ(std::get<int>(v[2].value), 2147483647);

  std::vector<et::BackendOption> bad = {make("nope", false)};
  kiln::Status s = kiln::delegate::fill_get_options(
      et::Span<et::BackendOption>(bad.data(), bad.size()), current, counters);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(BackendOptions, GraphPrecedence) {
  bool use = false;
  GraphsSource source;
  const std::string yes = "true", no = "false", junk = "maybe";
  LoadOptions none, load_on;
  load_on.use_cuda_graphs = true;
  // load option > metadata > process default > off
  ASSERT_TRUE(kiln::delegate::resolve_use_cuda_graphs(load_on, &no, false, &use, &source).is_ok());
  EXPECT_TRUE(use);
  EXPECT_EQ(source, GraphsSource::kLoadOption);
  ASSERT_TRUE(kiln::delegate::resolve_use_cuda_graphs(none, &no, true, &use, &source).is_ok());
  EXPECT_FALSE(use);
  EXPECT_EQ(source, GraphsSource::kEngineMetadata);
  ASSERT_TRUE(kiln::delegate::resolve_use_cuda_graphs(none, &yes, false, &use, &source).is_ok());
  EXPECT_TRUE(use);
  ASSERT_TRUE(kiln::delegate::resolve_use_cuda_graphs(none, nullptr, true, &use, &source).is_ok());
  EXPECT_TRUE(use);
  EXPECT_EQ(source, GraphsSource::kProcessDefault);
  ASSERT_TRUE(kiln::delegate::resolve_use_cuda_graphs(none, nullptr, false, &use, &source).is_ok());
  EXPECT_FALSE(use);
  kiln::Status s = kiln::delegate::resolve_use_cuda_graphs(none, &junk, false, &use, &source);
  EXPECT_EQ(s.code(), StatusCode::kCorruptData);
  EXPECT_NE(s.message().find("'maybe'"), std::string::npos);
}

// Through ExecuTorch's registry: the real KilnBackend (no GPU needed).
TEST(BackendOptions, RegisteredBackendValidatesWholeList) {
  et::runtime_init();
  ASSERT_NE(et::get_backend_class("KilnBackend"), nullptr);

  et::BackendOptions<4> set;
  ASSERT_EQ(set.set_option("use_cuda_graphs", true), et::Error::Ok);
  ASSERT_EQ(set.set_option("use_shared_engines", false), et::Error::Ok);
  ASSERT_EQ(et::set_option("KilnBackend", set.view()), et::Error::Ok);

  et::BackendOptions<4> get;
  ASSERT_EQ(get.set_option("use_cuda_graphs", false), et::Error::Ok);
  ASSERT_EQ(get.set_option("use_shared_engines", true), et::Error::Ok);
  ASSERT_EQ(get.set_option("runs", 0), et::Error::Ok);
  ASSERT_EQ(et::get_option("KilnBackend", get.view()), et::Error::Ok);
  bool graphs = false, engines = true;
  int runs = -1;
  ASSERT_EQ(get.get_option("use_cuda_graphs", graphs), et::Error::Ok);
  ASSERT_EQ(get.get_option("use_shared_engines", engines), et::Error::Ok);
  ASSERT_EQ(get.get_option("runs", runs), et::Error::Ok);
  EXPECT_TRUE(graphs);
  EXPECT_FALSE(engines);
  EXPECT_EQ(runs, 0);

  // A valid entry followed by a bad one: refused, and the valid one not applied.
  et::BackendOptions<4> bad;
  ASSERT_EQ(bad.set_option("use_cuda_graphs", false), et::Error::Ok);
  ASSERT_EQ(bad.set_option("use_shared_activation_scratch", 1), et::Error::Ok);
  EXPECT_EQ(et::set_option("KilnBackend", bad.view()), et::Error::InvalidArgument);
  ASSERT_EQ(et::get_option("KilnBackend", get.view()), et::Error::Ok);
  ASSERT_EQ(get.get_option("use_cuda_graphs", graphs), et::Error::Ok);
  EXPECT_TRUE(graphs);

  // Back to the defaults for whatever runs next in this process.
  et::BackendOptions<4> reset;
  ASSERT_EQ(reset.set_option("use_cuda_graphs", false), et::Error::Ok);
  ASSERT_EQ(reset.set_option("use_shared_engines", true), et::Error::Ok);
  ASSERT_EQ(et::set_option("KilnBackend", reset.view()), et::Error::Ok);
}

}  // namespace
