// deepinfer — command-line entry point. Subcommands live in cmd_*.cc.
// Exit status: 0 success; 2 on any error (one line "error: ..." on stderr);
// usage errors (bad flags or values) also exit 2 with one line; --help exits 0.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "commands.h"
#include "parallel/communicator.h"

namespace deepinfer::cli {

void RegisterVersion(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version");
  cmd->callback([] { std::printf("deepinfer 0.1.0\n"); });
}

void FollowerExit(int rc) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}

}  // namespace deepinfer::cli

namespace {
// An error on a rank of a parallel job: the other ranks may be waiting for
// this one in a collective, so the whole job ends (MPI_Abort) rather than hang.
int ErrorExit(const char* what) {
  std::fprintf(stderr, "error: %s\n", what);
  if (deepinfer::WorldIsMpi()) {
    std::fflush(stderr);
    if (deepinfer::WorldIsBroken()) std::_Exit(2);  // a peer is gone already
    deepinfer::AbortWorld(2);
  }
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  deepinfer::RetainFreedMemory();  // before any thread or large buffer
  deepinfer::InitLogging();
  CLI::App app{"deepinfer — inference engine for DeepSeek-V4-family models"};
  app.require_subcommand(1);
  deepinfer::cli::RegisterVersion(app);
  deepinfer::cli::RegisterMakeTiny(app);
  deepinfer::cli::RegisterInspect(app);
  deepinfer::cli::RegisterTokenize(app);
  deepinfer::cli::RegisterDetokenize(app);
  deepinfer::cli::RegisterGenerate(app);
  deepinfer::cli::RegisterServe(app);
  deepinfer::cli::RegisterBench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors follow the project rule too: one line, exit status 2.
    std::fprintf(stderr, "error: %s (run with --help for usage)\n", e.what());
    return 2;
  } catch (const deepinfer::Error& e) {
    return ErrorExit(e.what());
  } catch (const std::exception& e) {
    return ErrorExit(e.what());
  }
  deepinfer::ShutdownWorld();
  return 0;
}
