// deepinfer generate — the offline batch job: JSONL prompts in, JSONL results
// out (in input order), through the full engine (continuous batching, chunked
// prefill, paged cache, sampler).
//
// Input lines: {"prompt": "..."} | {"messages": [...]} | {"prompt_token_ids": [...]},
// each optionally with any sampling field of the OpenAI/vLLM API (max_tokens,
// temperature, top_p, top_k, min_p, penalties, seed, stop, stop_token_ids,
// ignore_eos, logprobs, prompt_logprobs, ...) overriding the command-line
// defaults, and a "request_id". A bad line yields {"index": i, "error": "..."}
// for that line only; every other line completes.
//
// Output lines: text, token_ids, finish_reason, stop_reason, prompt_tokens,
// completion_tokens, seed, logprobs (one object per generated token: token_id,
// token, logprob, rank, top_logprobs), prompt_logprobs (one element per prompt
// token in the same shape, null for the first token), timings.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_field.h"
#include "model/config.h"
#include "vision/image_source.h"
#include "commands.h"
#include "engine/parallel_runner.h"
#include "engine_flags.h"
#include "parallel/communicator.h"
#include "structured/constraint.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

using json = nlohmann::json;

struct GenerateOptions {
  EngineFlags engine;
  SamplingFlags sampling;
  std::string prompts, output;
  int64_t num_prompts = -1;
  bool thinking = false;
  bool no_progress = false;
};

// One position: {"token_id", "logprob", "rank", "top_logprobs": [{"token_id", "logprob", "rank", "token"}],
// "token"} ("token" = the decoded text, when the model has a tokenizer).
json EntryJson(const LogprobsEntry& e, const Tokenizer* tok) {
  json top = json::array();
  for (const auto& t : e.top) {
    json o = {{"token_id", t.token_id}, {"logprob", t.logprob}, {"rank", t.rank}};
    if (tok) o["token"] = tok->Decode(std::vector<int32_t>{t.token_id});
    top.push_back(o);
  }
  json c = {{"token_id", e.chosen.token_id}, {"logprob", e.chosen.logprob}, {"rank", e.chosen.rank},
            {"top_logprobs", top}};
  if (tok) c["token"] = tok->Decode(std::vector<int32_t>{e.chosen.token_id});
  return c;
}

json LogprobsJson(const std::vector<LogprobsEntry>& entries, const Tokenizer* tok) {
  json arr = json::array();
  for (const auto& e : entries) arr.push_back(EntryJson(e, tok));
  return arr;
}

// prompt_logprobs: one element per prompt token, null for the first (no context).
json PromptLogprobsJson(const std::vector<std::optional<LogprobsEntry>>& entries, const Tokenizer* tok) {
  json arr = json::array();
  for (const auto& e : entries) arr.push_back(e ? EntryJson(*e, tok) : json(nullptr));
  return arr;
}

void RunGenerate(const GenerateOptions& o) {
  const EngineArgs args = o.engine.Resolve();
  CheckParallelArgs(args, World().size());  // before anything else (serve binds its port next)
  // Under mpirun, ranks > 0 follow the leader's steps (docs/parallel.md).
  if (IsFollowerRank()) {
    if (const int rc = RunFollower(args); rc != 0) FollowerExit(rc);
    return;
  }
  if (std::filesystem::is_directory(o.prompts))
    Fail(ErrorKind::kInvalidArgument, "--prompts {}: is a directory, expected a JSONL file", o.prompts);
  std::ifstream in(o.prompts);
  if (!in) Fail(ErrorKind::kNotFound, "--prompts {}: cannot open file", o.prompts);
  std::ofstream out(o.output, std::ios::trunc);
  if (!out) Fail(ErrorKind::kInvalidArgument, "--output {}: cannot open for writing", o.output);
  // Command-line sampling defaults (validated once, up front).
  SamplingParams defaults = SamplingParams::FromJson(o.sampling.given);

  auto engine = Engine::Open(args);
  const Tokenizer* tok = engine->tokenizer();
  std::optional<ModelConfig> vision_cfg;  // set for a model with a vision tower
  if (ModelConfig c = ModelConfig::Load(args.model); c.vision_enabled()) vision_cfg = c;
  SamplingLimits limits;
  limits.vocab_size = engine->vocab_size();
  limits.max_logprobs = args.max_logprobs;

  std::vector<json> results;
  std::map<uint64_t, size_t> line_of;
  std::set<size_t> unseeded_greedy;  // lines with temperature 0 and no seed
  std::string line;
  size_t index = 0;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (o.num_prompts >= 0 && static_cast<int64_t>(index) >= o.num_prompts) break;
    const size_t i = index++;
    results.push_back(json{{"index", i}});
    try {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        Fail(ErrorKind::kInvalidArgument, "invalid JSON: {}", e.what());
      }
      if (!j.is_object()) Fail(ErrorKind::kInvalidArgument, "a line must be a JSON object");
      // A misspelt field (e.g. "max_token") would silently fall back to the
      // default, so unknown keys are an error naming the key.
      static const std::set<std::string> kKnown = {
          "prompt", "messages", "prompt_token_ids", "request_id", "thinking", "temperature", "top_p", "top_k",
          "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "seed",
          "max_tokens", "min_tokens", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
          "logprobs", "prompt_logprobs", "response_format", "guided_json", "guided_regex", "guided_choice",
          "guided_grammar", "structured_outputs", "images"};
      for (const auto& [key, value] : j.items())
        if (!kKnown.contains(key))
          Fail(ErrorKind::kInvalidArgument, "unknown field \"{}\" (input lines take prompt | messages | prompt_token_ids, request_id, "
               "thinking and the sampling fields of the API)", key);
      GenerateRequest req;
      bool thinking = false;
      if (j.contains("request_id")) {
        if (!j["request_id"].is_string()) Fail(ErrorKind::kInvalidArgument, "request_id must be a string");
        req.request_id = j["request_id"].get<std::string>();
        results.back()["request_id"] = req.request_id;
      } else {
        req.request_id = std::to_string(i);
      }
      const int n_inputs = j.contains("prompt") + j.contains("messages") + j.contains("prompt_token_ids");
      if (n_inputs != 1)
        Fail(ErrorKind::kInvalidArgument, "a line needs exactly one of \"prompt\", \"messages\", \"prompt_token_ids\"");
      if (j.contains("prompt")) {
        if (!j["prompt"].is_string()) Fail(ErrorKind::kInvalidArgument, "prompt must be a string");
        req.prompt = j["prompt"].get<std::string>();
      } else if (j.contains("messages")) {
        if (!tok) Fail(ErrorKind::kInvalidArgument, "messages need tokenizer.json in the model directory");
        if (j["messages"].is_array() && j["messages"].empty())
          Fail(ErrorKind::kInvalidArgument, "messages must not be empty");
        ChatOptions chat;
        chat.encoding = ChatEncodingForModelType(engine->model_type());
        chat.add_generation_prompt = true;
        chat.thinking = o.thinking;
        if (j.contains("thinking")) {
          if (!j["thinking"].is_boolean()) Fail(ErrorKind::kInvalidArgument, "thinking must be true or false");
          chat.thinking = j["thinking"].get<bool>();
        }
        // Key order matters to the renderer (tool arguments are dumped as written).
        const auto ordered = nlohmann::ordered_json::parse(line);
        if (vision_cfg) {  // image blocks: data: URLs or local files (docs/vision.md)
          int n_images = 0;
          std::vector<int32_t> ids = EncodeChatWithImages(*tok, ordered["messages"], chat,
                                                          static_cast<int32_t>(vision_cfg->image_token_id), &n_images);
          if (n_images > 0) {
            req.images = vision::CollectImages(j["messages"], vision::VisionGeometry::FromConfig(*vision_cfg),
                                               /*allow_files=*/true);
            ids = vision::ExpandPlaceholders(ids, static_cast<int32_t>(vision_cfg->image_token_id), req.images);
          }
          req.prompt_token_ids = std::move(ids);
        } else {
          // No vision tower: an image block is an error (as the server's 400), not placeholder text.
          for (size_t i = 0; i < j["messages"].size(); ++i) {
            const json& m = j["messages"][i];
            if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
            for (size_t k = 0; k < m["content"].size(); ++k) {
              const json& b = m["content"][k];
              if (b.is_object() && (StringField(b, "type") == "image_url" || StringField(b, "type") == "image"))
                Fail(ErrorKind::kInvalidArgument,
                     "messages[{}].content[{}]: this model has no vision tower; images are not supported", i, k);
            }
          }
          req.prompt_token_ids = EncodeChat(*tok, ordered["messages"], chat);
        }
        thinking = chat.thinking;
      } else {
        if (j.contains("images") && !j.contains("prompt_token_ids"))
          Fail(ErrorKind::kInvalidArgument, "images go with prompt_token_ids; with messages use image_url content blocks");
        const json& ids = j["prompt_token_ids"];
        if (!ids.is_array()) Fail(ErrorKind::kInvalidArgument, "prompt_token_ids must be an array of integers");
        std::vector<int32_t> v;
        for (const auto& x : ids) {
          if (!x.is_number_integer()) Fail(ErrorKind::kInvalidArgument, "prompt_token_ids must be an array of integers");
          const int64_t t = x.get<int64_t>();
          if (t < 0 || t >= engine->vocab_size())
            Fail(ErrorKind::kInvalidArgument, "prompt_token_ids[{}] = {} is outside the vocabulary [0, {})", v.size(), t,
                 engine->vocab_size());
          v.push_back(static_cast<int32_t>(t));
        }
        req.prompt_token_ids = std::move(v);
        if (j.contains("images")) {  // one image per image_token_id of the ids (docs/vision.md)
          if (!vision_cfg) Fail(ErrorKind::kInvalidArgument, "images: the model has no vision tower");
          if (!j["images"].is_array()) Fail(ErrorKind::kInvalidArgument, "images must be an array of URLs or paths");
          const vision::VisionGeometry g = vision::VisionGeometry::FromConfig(*vision_cfg);
          for (size_t k = 0; k < j["images"].size(); ++k) {
            const json& u = j["images"][k];
            if (!u.is_string()) Fail(ErrorKind::kInvalidArgument, "images[{}] must be a string (data: URL or path)", k);
            const std::string field = fmt::format("images[{}]", k);
            const std::string bytes = vision::ImageUrlBytes(u.get<std::string>(), field, /*allow_files=*/true);
            try {
              req.images.push_back(std::make_shared<const vision::PreparedImage>(vision::PrepareImage(bytes, g)));
            } catch (const Error& e) {
              Fail(ErrorKind::kInvalidArgument, "{}: {}", field, e.what());
            }
          }
        }
      }
      req.params = SamplingParams::FromJson(j, defaults, limits);
      // Structured output (the API's fields; response_format only with messages, as on the chat endpoint).
      if (auto spec = structured::ParseConstraintFields(nlohmann::ordered_json::parse(line), j.contains("messages"))) {
        spec->after_reasoning = thinking;
        req.constraint = structured::CompileConstraint(*spec);
      }
      // Greedy with no seed given: no seed is used, so none is reported (null).
      if (req.params.temperature == 0 && !req.params.seed) unseeded_greedy.insert(i);
      line_of[engine->Submit(req)] = i;
    } catch (const Error& e) {
      results.back()["error"] = e.what();
    }
  }

  const bool progress = !o.no_progress && isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  const size_t total = line_of.size();
  while (engine->HasUnfinished()) {
    for (RequestOutput& r : engine->Step()) {
      if (!r.finished) continue;
      json& res = results[line_of.at(r.id)];
      res["text"] = r.text;
      res["token_ids"] = r.token_ids;
      res["finish_reason"] = r.finish_reason;
      if (r.stop_reason) {
        if (std::holds_alternative<std::string>(*r.stop_reason)) res["stop_reason"] = std::get<std::string>(*r.stop_reason);
        else res["stop_reason"] = std::get<int64_t>(*r.stop_reason);
      }
      if (!r.error.empty()) res["error"] = r.error;
      res["prompt_tokens"] = r.num_prompt_tokens;
      res["cached_tokens"] = r.num_cached_tokens;
      res["completion_tokens"] = r.token_ids.size();
      if (unseeded_greedy.count(line_of.at(r.id))) res["seed"] = nullptr;
      else res["seed"] = r.seed;
      if (!r.logprobs.empty()) res["logprobs"] = LogprobsJson(r.logprobs, tok);
      if (!r.prompt_logprobs.empty()) res["prompt_logprobs"] = PromptLogprobsJson(r.prompt_logprobs, tok);
      res["time_to_first_token_s"] = r.time_to_first_token_s;
      res["total_time_s"] = r.total_time_s;
      ++done;
    }
    if (progress) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const EngineStats s = engine->Stats();
      std::fprintf(stderr, "\r[%zu/%zu] requests done, %.1f gen tok/s, KV blocks %lld/%lld   ", done, total,
                   el > 0 ? s.generation_tokens_total / el : 0.0, static_cast<long long>(s.num_kv_blocks_used),
                   static_cast<long long>(s.num_kv_blocks));
      std::fflush(stderr);
    }
  }
  if (progress) std::fprintf(stderr, "\n");
  // Error messages may quote bytes of an invalid input line: replace invalid UTF-8 rather than fail.
  for (const json& r : results) out << r.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  out.flush();
  if (!out) Fail(ErrorKind::kInvalidArgument, "--output {}: write failed", o.output);
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats s = engine->Stats();
  if (s.dp_requests.size() > 1) {
    std::string per;
    for (size_t i = 0; i < s.dp_requests.size(); ++i)
      per += fmt::format("{}rank {}: {} requests, {} dummy steps", i ? "; " : "", i, s.dp_requests[i], s.dp_dummy_steps[i]);
    std::fprintf(stderr, "generate: data parallel: %s | %lld prefill steps, %lld decode steps\n", per.c_str(),
                 static_cast<long long>(s.num_prefill_steps), static_cast<long long>(s.num_decode_steps));
  }
  size_t errors = 0;
  for (const json& r : results) errors += r.contains("error");
  std::fprintf(stderr,
               "generate: %zu requests (%zu errors) in %.2f s | prompt %lld tok (%.1f tok/s) | generation %lld tok "
               "(%.1f tok/s) | peak KV blocks used %lld of %lld | preemptions %lld\n",
               results.size(), errors, el, static_cast<long long>(s.prompt_tokens_total),
               el > 0 ? s.prompt_tokens_total / el : 0.0, static_cast<long long>(s.generation_tokens_total),
               el > 0 ? s.generation_tokens_total / el : 0.0, static_cast<long long>(s.peak_kv_blocks_used),
               static_cast<long long>(s.num_kv_blocks), static_cast<long long>(s.num_preemptions));
  if (s.prefix_caching)
    std::fprintf(stderr, "generate: prefix cache: %lld of %lld prompt tokens hit (%.1f%%), %lld cached blocks\n",
                 static_cast<long long>(s.prefix_cache_hits), static_cast<long long>(s.prefix_cache_queries),
                 s.prefix_cache_queries > 0 ? 100.0 * s.prefix_cache_hits / s.prefix_cache_queries : 0.0,
                 static_cast<long long>(s.num_cached_blocks));
  if (s.spec_num_speculative_tokens > 0) {
    std::string per;
    for (size_t i = 0; i < s.spec_num_accepted_tokens_per_pos.size(); ++i)
      per += fmt::format("{}{}", i ? "," : "", s.spec_num_accepted_tokens_per_pos[i]);
    std::fprintf(stderr,
                 "generate: speculative decoding: %lld drafts, %lld draft tokens, %lld accepted (%.1f%%), mean "
                 "accepted length %.3f, accepted per position [%s]\n",
                 static_cast<long long>(s.spec_num_drafts), static_cast<long long>(s.spec_num_draft_tokens),
                 static_cast<long long>(s.spec_num_accepted_tokens),
                 s.spec_num_draft_tokens > 0 ? 100.0 * s.spec_num_accepted_tokens / s.spec_num_draft_tokens : 0.0,
                 s.spec_mean_accepted_length(), per.c_str());
  }
  if (engine->fatal_error()) Fail(ErrorKind::kUnavailable, "{}", *engine->fatal_error());
}

}  // namespace

void RegisterGenerate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Offline batch generation: JSONL prompts in, JSONL results out");
  auto o = std::make_shared<GenerateOptions>();
  cmd->add_option("--model", o->engine.args.model, "Model directory")->required();
  cmd->add_option("--prompts", o->prompts, "Input JSONL file")->required();
  cmd->add_option("--output", o->output, "Output JSONL file")->required();
  cmd->add_option("--num-prompts", o->num_prompts, "Use only the first N prompts")->check(NonNegativeInt());
  cmd->add_flag("--thinking", o->thinking, "Render chat messages in thinking mode");
  cmd->add_flag("--no-progress", o->no_progress, "No progress bar");
  AddEngineFlags(cmd, &o->engine);
  AddSamplingFlags(cmd, &o->sampling);
  cmd->add_option_function<int64_t>(
      "--prompt-logprobs", [o](const int64_t& v) { o->sampling.given["prompt_logprobs"] = v; },
      "Return the logprob of every prompt token and the top-K at each prompt position (-1 = whole vocabulary)");
  cmd->callback([o] { RunGenerate(*o); });
}

}  // namespace deepinfer::cli
