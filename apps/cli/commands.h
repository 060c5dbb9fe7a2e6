// deepinfer CLI subcommands. Each Register* adds one subcommand to the app;
// the callback runs the command and throws deepinfer::Error on failure (main
// prints "error: <message>" and exits with status 2).
#pragma once

#include <CLI/CLI.hpp>

namespace deepinfer::cli {

void RegisterVersion(CLI::App& app);
void RegisterMakeTiny(CLI::App& app);   // cmd_make_tiny.cc
void RegisterInspect(CLI::App& app);    // cmd_inspect.cc
void RegisterTokenize(CLI::App& app);    // cmd_tokenize.cc: deepinfer tokenize --model DIR
void RegisterDetokenize(CLI::App& app);  // cmd_tokenize.cc: deepinfer detokenize --model DIR
void RegisterGenerate(CLI::App& app);    // cmd_generate.cc: deepinfer generate --model DIR --prompts IN --output OUT
void RegisterServe(CLI::App& app);      // cmd_serve.cc: deepinfer serve MODEL_DIR --host 127.0.0.1 --port 8000
void RegisterBench(CLI::App& app);      // cmd_bench.cc: deepinfer bench kernels|e2e --json OUT
// A follower rank that could not follow (main.cc): exits with `rc` at once,
// without MPI_Finalize (its peers may be gone or waiting in a collective).
[[noreturn]] void FollowerExit(int rc);
// Each of these is implemented in its own apps/cli/cmd_*.cc:
//   RegisterInspect   (cmd_inspect.cc)    deepinfer inspect MODEL_DIR
//   RegisterMakeTiny  (cmd_make_tiny.cc)  deepinfer make-tiny --arch deepseek_v41 OUT_DIR
// Add new commands here and in main.cc (one line each). Parallel work: build in build-<yourname>,
// commit only your own files by path (README "Working in parallel").

}  // namespace deepinfer::cli
