#include "base/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace deepinfer {

void InitLogging() {
  static bool done = false;
  if (done) return;
  done = true;
  auto logger = spdlog::stderr_color_mt("deepinfer");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  const char* lvl = std::getenv("DEEPINFER_LOG_LEVEL");
  spdlog::set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
}

}  // namespace deepinfer
