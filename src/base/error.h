// deepinfer/base/error.h — the project's one error rule.
//
// Rule (README "Errors"): library code reports failures by throwing
// deepinfer::Error (or a subclass). The message is one line, names the
// offending thing (file, tensor, field, request) and, where it applies, says
// "expected X, found Y". Errors are caught only at boundaries: the CLI
// (apps/cli: prints "error: <message>" on stderr and exits with status 2), the
// HTTP server (turns them into an OpenAI error body for that one request), and
// the engine step loop (fails the one request that caused it). Hot loops do not
// throw; they validate before entering.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace deepinfer {

// Category of an error; lets boundaries map errors to exit codes / HTTP codes.
enum class ErrorKind {
  kInvalidArgument,  // bad user input (CLI flag, request field, config value)
  kNotFound,         // missing file, tensor, key
  kCorruptData,      // malformed file contents (safetensors header, JSON)
  kOutOfRange,       // index/offset/length past a limit
  kResourceExhausted,// out of KV blocks, memory
  kInternal,         // a bug: an invariant that should hold did not
  kUnavailable,      // a peer rank of a parallel job is gone (parallel/communicator.h)
};

const char* ErrorKindName(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws Error(kind, fmt::format(...)).
template <typename... Args>
[[noreturn]] void Fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace deepinfer

// DI_CHECK(cond) << nothing fancy: internal invariant; throws kInternal with file:line.
#define DI_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond))                                                                    \
      ::deepinfer::Fail(::deepinfer::ErrorKind::kInternal, "internal check failed: {} ({}:{})", \
                        #cond, __FILE__, __LINE__);                                 \
  } while (0)
