#include "runtime/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::runtime {
namespace {

std::atomic<LogSink> g_sink{nullptr};

bool env_debug() {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_LOG");
    return v != nullptr && std::strcmp(v, "debug") == 0;
  }();
  return enabled;
}

}  // namespace

void set_log_sink(LogSink sink) { g_sink.store(sink); }

bool debug_log_enabled() { return g_sink.load() != nullptr || env_debug(); }

void log_message(LogLevel level, const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  if (LogSink sink = g_sink.load()) {
    sink(level, message);
    return;
  }
  if (level == LogLevel::kDebug && !env_debug()) return;
  std::fprintf(stderr, "kiln: %s\n", message);
}

}  // namespace kiln::runtime
