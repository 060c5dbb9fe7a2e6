// deepinfer bench structured --model DIR --json OUT: structured-output costs on
// the model's real vocabulary — compile time per constraint and token-mask time
// per decoding step for a nested JSON schema, a regex and a GBNF grammar — and
// the tiny model's batch-1 decode step from the same run, for the ratio.
//
// Mask times come from a seeded random walk over the masks (each step: mask,
// pick a random allowed token, advance), `--steps` steps or until the
// constraint ends, repeated with fresh grammars. "cold": the walk on a fresh
// compiled grammar (every state seen for the first time: DFA transitions and
// the trie walk computed); "warm": the same walk again on the same grammar (what
// repeated requests with one schema see: cached masks). One thread.
#include <algorithm>
#include <cstdio>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "bench_util.h"
#include "deepinfer/engine.h"
#include "structured/constraint.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli::bench {
namespace {

struct StructuredArgs {
  std::string model, json_out;
  int steps = 200, walks = 5;
};

const char* kNestedSchema = R"({"type": "object", "properties": {
  "id": {"type": "integer"}, "name": {"type": "string", "maxLength": 40},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"], "additionalProperties": false},
  "tags": {"type": "array", "items": {"enum": ["new", "vip", "churned"]}, "maxItems": 3},
  "orders": {"type": "array", "items": {"$ref": "#/$defs/order"}, "maxItems": 4},
  "status": {"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]}},
  "required": ["id", "name", "address", "tags", "orders", "status"], "additionalProperties": false,
  "$defs": {"order": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
    "qty": {"type": "integer"}, "price": {"type": "number"}}, "required": ["sku", "qty", "price"],
    "additionalProperties": false}}})";
const char* kRegex = R"((GET|POST|PUT) /[a-z]{1,12}(/[a-z0-9]{1,12}){0,4}\?([a-z]{1,8}=[A-Za-z0-9]{1,16}&){0,3}[a-z]{1,8}=[0-9]{1,10})";
const char* kGbnf = R"G(root ::= stmt ("\n" stmt){0,9}
stmt ::= ident " = " expr ";"
expr ::= term ((" + " | " - " | " * ") term)*
term ::= ident | num | "(" expr ")" | ident "(" (expr (", " expr)*)? ")"
ident ::= [a-z_] [a-z0-9_]{0,15}
num ::= [0-9]{1,6} ("." [0-9]{1,4})?
)G";

nlohmann::json Stats(std::vector<double> us) {
  if (us.empty()) return nlohmann::json::object();
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double x : us) sum += x;
  return {{"median_us", Median(us)}, {"p90_us", us[us.size() * 9 / 10]}, {"max_us", us.back()},
          {"mean_us", sum / static_cast<double>(us.size())}, {"steps", us.size()}};
}

void RunStructured(const StructuredArgs& a) {
  CheckWritable(a.json_out, "--json");
  SetNumThreads(1);
  const Tokenizer tok = Tokenizer::Load(a.model);
  // The decode step of the model, batch 1, from the same run.
  EngineArgs ea;
  ea.model = a.model;
  ea.max_num_seqs = 1;
  ea.max_model_len = 1024;
  ea.num_threads = 1;
  auto engine = Engine::Open(ea);
  const int64_t vocab_size = engine->vocab_size();
  double decode_step_us = 0;
  {
    GenerateRequest g;
    g.prompt = "Hello";
    g.params.max_tokens = 65;
    g.params.ignore_eos = true;
    g.params.temperature = 0;
    engine->Submit(g);
    std::vector<double> steps;
    bool first = true;
    while (engine->HasUnfinished()) {
      const double t0 = Now();
      engine->Step();
      if (!first) steps.push_back((Now() - t0) * 1e6);
      first = false;
    }
    decode_step_us = Median(steps);
  }
  const int32_t eos = tok.eos_id();
  structured::TokenVocab vocab(tok, vocab_size, {eos});
  std::printf("vocabulary: %lld ids, trie of %lld nodes; tiny-model decode step (batch 1, 1 thread): %.0f us\n",
              static_cast<long long>(vocab_size), static_cast<long long>(vocab.num_trie_nodes()), decode_step_us);
  using K = structured::ConstraintSpec::Kind;
  const std::vector<std::pair<std::string, structured::ConstraintSpec>> cases = {
      {"json_schema_nested", {K::kJsonSchema, nlohmann::json::parse(kNestedSchema).dump(), "guided_json", "guided_json", false}},
      {"regex", {K::kRegex, kRegex, "guided_regex", "guided_regex", false}},
      {"gbnf", {K::kGrammar, kGbnf, "guided_grammar", "guided_grammar", false}},
  };
  nlohmann::json out = {{"machine", MachineJson(1)},
                        {"vocab_size", vocab_size},
                        {"trie_nodes", vocab.num_trie_nodes()},
                        {"decode_step_us", decode_step_us},
                        {"cases", nlohmann::json::object()}};
  std::vector<uint32_t> words(static_cast<size_t>(vocab.num_words()));
  for (const auto& [name, spec] : cases) {
    std::vector<double> compile_us, cold_us, warm_us;
    int64_t tokens = 0;
    for (int w = 0; w < a.walks; ++w) {
      const double t0 = Now();
      auto g = std::make_shared<structured::CompiledGrammar>(structured::BuildGrammar(spec), spec.what);
      g->InitialConfig();
      compile_us.push_back((Now() - t0) * 1e6);
      for (int pass = 0; pass < 2; ++pass) {
        std::mt19937_64 rng(1234 + static_cast<uint64_t>(w));
        structured::Matcher m(g, &vocab);
        for (int s = 0; s < a.steps && !m.finished(); ++s) {
          const double t1 = Now();
          m.FillMask(words);
          (pass == 0 ? cold_us : warm_us).push_back((Now() - t1) * 1e6);
          std::vector<int32_t> allowed;
          for (size_t i = 0; i < words.size(); ++i)
            for (uint32_t b = words[i]; b; b &= b - 1) allowed.push_back(static_cast<int32_t>(i * 32 + __builtin_ctz(b)));
          if (allowed.empty()) Fail(ErrorKind::kInternal, "{}: empty mask at step {}", name, s);
          // Prefer ending (EOS) only when nothing else is allowed, so walks are long.
          int32_t t = allowed[rng() % allowed.size()];
          if (t == eos && allowed.size() > 1) t = allowed[(rng() % (allowed.size() - 1)) + (allowed[0] == eos ? 1 : 0)];
          if (!m.AcceptToken(t)) Fail(ErrorKind::kInternal, "{}: token {} from the mask was rejected", name, t);
          if (pass == 0) ++tokens;
        }
      }
    }
    const nlohmann::json cold = Stats(cold_us), warm = Stats(warm_us);
    out["cases"][name] = {{"compile_us", Stats(compile_us)}, {"mask_cold", cold}, {"mask_warm", warm},
                          {"walk_tokens", tokens},
                          {"cold_median_fraction_of_decode_step", cold["median_us"].get<double>() / decode_step_us},
                          {"warm_median_fraction_of_decode_step", warm["median_us"].get<double>() / decode_step_us}};
    std::printf("%-20s compile %8.0f us | mask cold median %8.1f us p90 %8.1f us (%.1f%% of a decode step) | warm median "
                "%6.1f us (%.2f%%) | %lld walk tokens\n",
                name.c_str(), Median(compile_us), cold["median_us"].get<double>(), cold["p90_us"].get<double>(),
                100 * cold["median_us"].get<double>() / decode_step_us, warm["median_us"].get<double>(),
                100 * warm["median_us"].get<double>() / decode_step_us, static_cast<long long>(tokens));
  }
  WriteJson(a.json_out, out);
  std::printf("wrote %s\n", a.json_out.c_str());
}

}  // namespace

void RegisterBenchStructured(CLI::App& bench) {
  auto a = std::make_shared<StructuredArgs>();
  auto* c = bench.add_subcommand("structured", "Structured output: constraint compile time and token-mask time per step");
  c->add_option("--model", a->model, "Model directory (tokenizer.json; its tiny checkpoint for the decode step)")->required();
  c->add_option("--json", a->json_out, "Output JSON file")->required();
  c->add_option("--steps", a->steps, "Steps per random walk")->capture_default_str();
  c->add_option("--walks", a->walks, "Random walks (fresh grammars) per constraint")->capture_default_str();
  c->callback([a] {
    if (a->steps < 1) Fail(ErrorKind::kInvalidArgument, "--steps must be >= 1, got {}", a->steps);
    if (a->walks < 1) Fail(ErrorKind::kInvalidArgument, "--walks must be >= 1, got {}", a->walks);
    RunStructured(*a);
  });
}

}  // namespace deepinfer::cli::bench
