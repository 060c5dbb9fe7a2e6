// deepinfer/base/log.h — logging goes through spdlog (README "Logging").
// Use spdlog::info/warn/error directly; this header only fixes the default
// pattern and the level, read once from the DEEPINFER_LOG_LEVEL environment
// variable (trace, debug, info, warn, error, off; default info). Logs go to
// stderr so stdout stays machine-readable for the CLI.
#pragma once

#include <spdlog/spdlog.h>

namespace deepinfer {

// Installs the stderr logger with the project pattern. Idempotent.
void InitLogging();

}  // namespace deepinfer
