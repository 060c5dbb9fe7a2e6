// libFuzzer target: request bodies of /v1/completions, /v1/chat/completions
// and /tokenize (the first byte picks the endpoint, the rest is the body):
// ParseJsonBody, the schema parsers, ToGenerateRequests, and a response built
// from a fake engine output (Final() and the SSE events). Contract: a parsed
// request, or ApiError / deepinfer::Error — never a crash or another
// exception. Build and run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "tokenizer/chat_format.h"

using namespace deepinfer;
using json = nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int endpoint = data[0] % 3;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const server::ModelInfo& info = fuzzing::SharedInfo();
  try {
    const json body = server::ParseJsonBody(text);
    if (endpoint == 2) {  // /tokenize
      if (body.contains("messages")) {
        const auto ordered = nlohmann::ordered_json::parse(text);
        const ChatOptions chat = server::ChatOptionsFor(body, ordered, info);
        if (ordered["messages"].is_array()) EncodeChat(*info.tokenizer, ordered["messages"], chat);
      } else if (body.contains("prompt") && body["prompt"].is_string()) {
        info.tokenizer->Encode(body["prompt"].get<std::string>(), true);
      }
      return 0;
    }
    server::ParsedRequest r = endpoint == 0 ? server::ParseCompletionRequest(body, info)
                                            : server::ParseChatRequest(body, nlohmann::ordered_json::parse(text), info);
    const auto gens = r.ToGenerateRequests("cmpl-f");
    // A response from one fake output per choice.
    server::ResponseBuilder b(r, info, "cmpl-f", 1);
    server::ResponseBuilder s(r, info, "cmpl-f", 1);
    std::string events = s.Prologue();
    for (int c = 0; c < r.num_choices(); ++c) {
      server::ChoiceOutput o;
      o.index = c;
      o.out.new_token_ids = {5};
      o.out.new_text = "x</think>y";
      if (r.want_logprobs) o.out.new_logprobs = {LogprobsEntry{TokenLogprob{5, -1.0f, 1}, {TokenLogprob{6, -0.5f, 1}}}};
      if (gens[static_cast<size_t>(c)].params.prompt_logprobs) {
        o.out.prompt_logprobs.resize(gens[static_cast<size_t>(c)].prompt_token_ids->size());
        for (size_t p = 1; p < o.out.prompt_logprobs.size(); ++p)
          o.out.prompt_logprobs[p] = LogprobsEntry{TokenLogprob{(*gens[static_cast<size_t>(c)].prompt_token_ids)[p], -2.0f, 3},
                                                   {TokenLogprob{7, -0.1f, 1}}};
      }
      o.out.finished = true;
      o.out.finish_reason = "length";
      server::ChoiceOutput o2 = o;
      b.OnOutput(std::move(o));
      if (!r.want_prompt_logprobs) events += s.OnStreamOutput(std::move(o2));
    }
    server::Dump(b.Final());
    events += s.Epilogue();
  } catch (const server::ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
