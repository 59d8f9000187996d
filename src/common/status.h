// Kiln's error values. Runtime code (engine format, runtime, delegate) never
// throws: every fallible call returns a Status or Result<T> that carries a code
// and a message which gains context as it travels up (KILN_RETURN_IF_ERROR).
// The delegate turns it into an ExecuTorch Error in one place.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from the caller: shape, dtype, option
  kCorruptData,      // a file or blob that fails validation
  kIncompatible,     // valid, but not for this runtime / GPU / version
  kUnavailable,      // no GPU, no driver, library missing
  kOutOfMemory,
  kInternal,         // a CUDA / library failure or a broken assumption
  kUnsupported,      // an op or feature Kiln does not implement
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prepends "context: " so the outermost caller reads the whole path.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

  std::string to_string() const {
    return std::string(status_code_name(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// printf-style constructor for the common case.
Status make_status(StatusCode code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {}  // NOLINT

  bool is_ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Evaluates `expr` once; returns its Status from the enclosing function if it
// is not ok.
#define KILN_RETURN_IF_ERROR(expr)                      \
  do {                                                  \
    ::kiln::Status kiln_status_ = (expr);               \
    if (!kiln_status_.is_ok()) return kiln_status_;     \
  } while (0)

// KILN_ASSIGN_OR_RETURN(auto x, make_x()); evaluates the Result once.
#define KILN_ASSIGN_OR_RETURN(lhs, expr)                                   \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_result_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.is_ok()) return tmp.status();           \
  lhs = std::move(tmp).value()
