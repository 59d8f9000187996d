// The runtime's diagnostic log. The runtime has no ExecuTorch dependency, so
// it cannot call ET_LOG itself: messages go to a sink the embedding code may
// install (the delegate can forward them to ET_LOG), else, for debug
// messages, to stderr when KILN_LOG=debug is set. Only load-time code logs;
// nothing on the execute path does.
#pragma once

namespace kiln::runtime {

enum class LogLevel { kDebug = 0, kInfo = 1, kError = 2 };

// Receives each formatted message (no trailing newline). Called on the
// logging thread; must be thread-safe. nullptr restores the default.
using LogSink = void (*)(LogLevel level, const char* message);
void set_log_sink(LogSink sink);

// True when a debug message would go anywhere (a sink is set, or KILN_LOG=debug).
bool debug_log_enabled();

// printf-style; messages longer than 1 KiB are cut.
void log_message(LogLevel level, const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

}  // namespace kiln::runtime

// Evaluates its arguments only when debug logging is enabled.
#define KILN_LOG_DEBUG(...)                                                     \
  do {                                                                          \
    if (::kiln::runtime::debug_log_enabled())                                   \
      ::kiln::runtime::log_message(::kiln::runtime::LogLevel::kDebug, __VA_ARGS__); \
  } while (0)
