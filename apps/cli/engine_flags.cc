#include "engine_flags.h"

#include <cctype>
#include <cmath>
#include <memory>

#include "base/error.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"

namespace deepinfer::cli {

std::vector<int64_t> ParseIntList(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  if (s.empty()) return out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      Fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a positive integer (expected a list like 16,64,256)", flag, item);
    }
    i = j + 1;
  }
  return out;
}

int64_t ParseBytes(const std::string& s, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    Fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a size (e.g. 4GiB, 512MiB, 1000000)", flag, s);
  }
  std::string unit = s.substr(used);
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else Fail(ErrorKind::kInvalidArgument, "{}: unknown unit '{}' in '{}' (use B, KiB, MiB, GiB, KB, MB, GB)", flag, unit, s);
  if (!(v > 0) || !std::isfinite(v)) Fail(ErrorKind::kInvalidArgument, "{}: '{}' must be positive", flag, s);
  return static_cast<int64_t>(v * mult);
}

EngineArgs EngineFlags::Resolve() const {
  EngineArgs a = args;
  if (!kv_cache_memory.empty()) a.kv_cache_memory_bytes = ParseBytes(kv_cache_memory, "--kv-cache-memory");
  a.prefill_token_buckets = ParseIntList(prefill_buckets, "--prefill-token-buckets");
  a.decode_batch_buckets = ParseIntList(decode_buckets, "--decode-batch-buckets");
  a.logprobs_mode = ParseLogprobsMode(logprobs_mode);
  if (Fp8Format f; !ParseFp8Format(a.fp8_format, &f))  // before serve binds its port; Engine::Open checks too
    Fail(ErrorKind::kInvalidArgument, "--fp8-format: unknown format '{}' (expected e4m3fn or e4m3-ieee)", a.fp8_format);
  return a;
}

void AddEngineFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--max-num-seqs", f->args.max_num_seqs, "Maximum sequences running at once")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->args.max_num_batched_tokens, "Token budget per engine step")
      ->capture_default_str();
  cmd->add_option("--max-model-len", f->args.max_model_len, "Maximum prompt + output tokens of one request")
      ->capture_default_str();
  cmd->add_option("--block-size", f->args.block_size, "Tokens per KV-cache block")->capture_default_str();
  cmd->add_option("--num-kv-blocks", f->args.num_kv_blocks,
                  "Number of KV-cache blocks (default: from --kv-cache-memory, else max_num_seqs x max_model_len)")
      ->check(NonNegativeInt());
  cmd->add_option("--kv-cache-memory", f->kv_cache_memory, "KV/state cache size, e.g. 2GiB");
  cmd->add_option("--prefill-token-buckets", f->prefill_buckets, "Pad prefill steps to these token counts, e.g. 64,256,1024");
  cmd->add_option("--decode-batch-buckets", f->decode_buckets, "Pad decode steps to these batch sizes, e.g. 1,2,4,8");
  cmd->add_option("--prompt-as-decode-max-tokens", f->args.prompt_as_decode_max_tokens,
                  "Prompts of at most this many tokens run in decode-shaped steps")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
      "--target", [](const std::string& v) { cpu::SelectTarget(v); },
      "SIMD target of the CPU kernels: auto | avx512 | avx2 | the fallback (same bits on every target)");
  cmd->add_option("--threads", f->args.num_threads, "CPU threads (0 = all cores)")
      ->capture_default_str()
      ->check(NonNegativeInt());
  cmd->add_option("--max-logprobs", f->args.max_logprobs, "Largest logprobs a request may ask for")->capture_default_str();
  cmd->add_option("--logprobs-mode", f->logprobs_mode,
                  "raw_logprobs | raw_logits | processed_logprobs | processed_logits")
      ->capture_default_str();
  cmd->add_option("--engram-token-map", f->args.engram_token_map,
                  "int32 file with the Engram compressed token map (default: built from tokenizer.json)");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f->args.enable_prefix_caching,
                "Share the KV/state blocks of common prompt prefixes between requests (default on; docs/engine.md)");
  // Scale-out (docs/parallel.md): under mpirun -np N, every rank with the same flags.
  cmd->add_option("--ep,--expert-parallel-size", f->args.expert_parallel_size,
                  "Expert parallelism: routed experts split over N ranks (= mpirun -np N)")
      ->capture_default_str();
  cmd->add_option("--dp,--data-parallel-size", f->args.data_parallel_size,
                  "Data-parallel attention over N ranks (1 or --ep N)")
      ->capture_default_str();
  cmd->add_option("--cp,--context-parallel-size", f->args.context_parallel_size,
                  "Context parallelism: each sequence's paged KV/state split over N ranks (= mpirun -np N); "
                  "the pool flags are per rank");
  cmd->add_option("--prefill-attempt-interval", f->args.prefill_attempt_interval,
                  "With --dp: decode steps between prefill attempts while only some ranks have prompts")
      ->capture_default_str();
  cmd->add_option("--dp-moe-exchange", f->args.dp_moe_exchange,
                  "With --dp: auto (decode steps use the static all-gather path) | general (always all-to-all)")
      ->capture_default_str();
  cmd->add_option("--distributed-timeout", f->args.distributed_timeout_s,
                  "Seconds a collective may wait for its peers before the job fails (0 = forever)")
      ->capture_default_str();
  cmd->add_option("--speculative-config", f->args.speculative_config,
                  "Speculative decoding, vLLM's JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                  "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}'; methods ngram, dspark (deepseek_v41), mtp (deepseek_v4) (docs/speculative.md)");
  cmd->add_option("--fp8-format", f->args.fp8_format,
                  "FP8 numerics: e4m3fn (checkpoint) | e4m3-ieee (Neuron trn2: weights rescaled at load, max 224)")
      ->capture_default_str();
}

void AddSamplingFlags(CLI::App* cmd, SamplingFlags* f) {
  auto num = [cmd, f](const char* flag, const char* key, const char* help) {
    cmd->add_option_function<double>(flag, [f, key](const double& v) { f->given[key] = v; }, help);
  };
  auto integer = [cmd, f](const char* flag, const char* key, const char* help) {
    cmd->add_option_function<int64_t>(flag, [f, key](const int64_t& v) { f->given[key] = v; }, help);
  };
  num("--temperature", "temperature", "Sampling temperature (0 = greedy)");
  num("--top-p", "top_p", "Nucleus sampling probability");
  integer("--top-k", "top_k", "Keep the k most likely tokens (-1 = off)");
  num("--min-p", "min_p", "Minimum probability relative to the top token");
  num("--presence-penalty", "presence_penalty", "OpenAI presence penalty");
  num("--frequency-penalty", "frequency_penalty", "OpenAI frequency penalty");
  num("--repetition-penalty", "repetition_penalty", "vLLM repetition penalty");
  integer("--seed", "seed", "Sampling seed (default: drawn per request and reported)");
  integer("--max-tokens", "max_tokens", "Maximum generated tokens per request (default 16)");
  integer("--min-tokens", "min_tokens", "Minimum generated tokens before EOS/stop may end a request");
  integer("--logprobs", "logprobs", "Return the top-K logprobs of each generated token");
  cmd->add_option_function<std::vector<std::string>>(
      "--stop", [f](const std::vector<std::string>& v) { f->given["stop"] = v; }, "Stop string (repeatable)");
  cmd->add_option_function<std::vector<int64_t>>(
      "--stop-token-ids", [f](const std::vector<int64_t>& v) { f->given["stop_token_ids"] = v; }, "Stop token ids");
  cmd->add_option_function<std::string>(
      "--logit-bias",
      [f](const std::string& v) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(v);
        } catch (const nlohmann::json::exception&) {
          Fail(ErrorKind::kInvalidArgument, "--logit-bias: expected a JSON object of token id -> bias, e.g. "
               "'{{\"50256\": -100}}', got {}", v);
        }
        f->given["logit_bias"] = j;
      },
      "Bias added to these tokens' logits, a JSON object: '{\"50256\": -100}'");
  cmd->add_flag_function("--ignore-eos", [f](int64_t) { f->given["ignore_eos"] = true; }, "Do not stop at EOS");
  cmd->add_flag_function("--include-stop-str-in-output", [f](int64_t) { f->given["include_stop_str_in_output"] = true; },
                         "Keep the matched stop string in the output text");
}

}  // namespace deepinfer::cli
