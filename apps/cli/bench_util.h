// Shared helpers of the `deepinfer bench` subcommands (cmd_bench.cc,
// bench_e2e.cc): timing, medians, machine description, STREAM measurement and
// gnuplot-driven PNG plots.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace deepinfer::cli::bench {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double Median(std::vector<double> v);

// CPU model, core count, threads in use, dispatch target, cache sizes.
nlohmann::json MachineJson(int threads);

// STREAM copy and triad over arrays of `floats` elements, `reps` passes each;
// returns {"copy": {...}, "triad": {...}, "read": {...}} with per-pass GB/s
// samples, their median and best, and the array size.
nlohmann::json MeasureStream(int64_t floats, int reps);

// Writes `script` to `png`.gp and runs gnuplot on it (data files are the
// caller's). Returns false (with a warning) when gnuplot is not installed.
bool RunGnuplot(const std::filesystem::path& png, const std::string& script);

// Fails (Error kInvalidArgument naming `flag` and the path) unless `path` can
// be created or appended to; called before measuring so a bad output path does
// not cost a whole run. Creates missing parent folders; leaves no file behind
// when it did not exist.
void CheckWritable(const std::filesystem::path& path, const char* flag);

// Writes `j` pretty-printed to `path` (throws on I/O error).
void WriteJson(const std::filesystem::path& path, const nlohmann::json& j);

// Registers `deepinfer bench e2e` (bench_e2e.cc) under the bench command.
void RegisterBenchE2e(CLI::App& bench);
void RegisterBenchStructured(CLI::App& bench);  // bench_structured.cc

}  // namespace deepinfer::cli::bench
